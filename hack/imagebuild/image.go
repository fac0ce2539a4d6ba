package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sync/errgroup"

	"github.com/imagepipe/imagepipe/internal/imageref"
	"github.com/imagepipe/imagepipe/internal/registry"
)

// binaries are the commands under cmd/ that get an image.
var binaries = []string{"image-syncer", "image-gate", "imagectl"}

// architectures are the linux platforms of every index.
var architectures = []string{"amd64", "arm64"}

// result is one pushed index.
type result struct {
	binary string
	tag    name.Tag
	digest string // "sha256:..."
}

// versionPattern is what may be stamped as a version or revision: a tag's
// characters, so that it fits in -ldflags, a label and a tag.
var versionPattern = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}$`)

// buildAndPush builds an index per binary and pushes it to
// REGISTRY/BINARY:TAG.
func buildAndPush(ctx context.Context, log *slog.Logger, o options) ([]result, error) {
	client, err := registry.New(registry.WithInsecure(o.insecure), registry.WithCacheDir(""), registry.WithLogger(log))
	if err != nil {
		return nil, err
	}
	tags, err := o.tags()
	if err != nil {
		return nil, err
	}
	if err := checkModuleRoot(); err != nil {
		return nil, err
	}
	created := time.Unix(o.sourceDateEpoch, 0).UTC()
	log.Info("building", "version", o.version, "revision", o.revision, "created", created.Format(time.RFC3339))
	if strings.HasSuffix(o.version, "-dirty") {
		log.Warn("the working tree has uncommitted changes: no commit reproduces these images", "version", o.version)
	}

	dir, err := os.MkdirTemp("", "imagebuild-")
	if err != nil {
		return nil, fmt.Errorf("making a build directory: %w", err)
	}
	defer os.RemoveAll(dir)
	// Two builds at a time: the linker of one overlaps the compiler of
	// the other.
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(2)
	for _, b := range binaries {
		for _, arch := range architectures {
			g.Go(func() error {
				return compile(gctx, compileOptions{binary: b, arch: arch, version: o.version, revision: o.revision,
					out: filepath.Join(dir, b+"-"+arch)})
			})
		}
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}

	base, err := baseEntries()
	if err != nil {
		return nil, err
	}
	baseLayer, err := tarLayer(base, created)
	if err != nil {
		return nil, err
	}
	var results []result
	for i, b := range binaries {
		idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
		var sboms []v1.Image
		for _, arch := range architectures {
			path := filepath.Join(dir, b+"-"+arch)
			img, err := platformImage(baseLayer, b, arch, path, o, created)
			if err != nil {
				return nil, err
			}
			idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
				Add:        img,
				Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arch}},
			})
			if o.sbom {
				s, err := sbomArtifact(img, b, arch, path, o, created)
				if err != nil {
					return nil, err
				}
				sboms = append(sboms, s)
			}
		}
		idx = mutate.Annotations(idx, labels(b, o, created)).(v1.ImageIndex)
		pinned, err := client.Push(ctx, tags[i], idx)
		if err != nil {
			return nil, err
		}
		for _, s := range sboms {
			d, err := s.Digest()
			if err != nil {
				return nil, err
			}
			if _, err := client.Push(ctx, tags[i].Context().Digest(d.String()), s); err != nil {
				return nil, fmt.Errorf("pushing the SBOM of %s: %w", b, err)
			}
		}
		results = append(results, result{binary: b, tag: tags[i], digest: pinned.DigestStr()})
	}
	return results, nil
}

// revisionPattern is a commit hash (SHA-1 or SHA-256, maybe abbreviated).
var revisionPattern = regexp.MustCompile(`^[0-9a-f]{7,64}$`)

// tags checks the options that end up in references, -ldflags and labels,
// and returns the tag each binary's index is pushed to, in the order of
// binaries.
func (o options) tags() ([]name.Tag, error) {
	if !versionPattern.MatchString(o.version) {
		return nil, fmt.Errorf("the version %q is not letters, digits and ._+- (at most 128)", o.version)
	}
	if o.revision != "" && !revisionPattern.MatchString(o.revision) {
		return nil, fmt.Errorf("the revision %q is not a commit hash", o.revision)
	}
	nameOpts := []name.Option{name.StrictValidation}
	if o.insecure {
		nameOpts = append(nameOpts, name.Insecure)
	}
	tags := make([]name.Tag, len(binaries))
	for i, b := range binaries {
		ref, err := imageref.Parse(o.registry+"/"+b, imageref.FormRepository)
		if err != nil {
			return nil, fmt.Errorf("checking -registry: %w", err)
		}
		repo, err := registry.Names{Insecure: o.insecure}.Repository(ref)
		if err != nil {
			return nil, fmt.Errorf("checking -registry: %w", err)
		}
		if tags[i], err = name.NewTag(repo.Name()+":"+o.tag, nameOpts...); err != nil {
			return nil, fmt.Errorf("checking -tag: %w", err)
		}
	}
	return tags, nil
}

// platformImage is one binary's image for linux/arch: the base layer,
// then the binary's.
func platformImage(base v1.Layer, binary, arch, path string, o options, created time.Time) (v1.Image, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the built binary: %w", err)
	}
	binLayer, err := tarLayer(binaryEntries(binary, data), created)
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	when := v1.Time{Time: created}
	img, err = mutate.Append(img,
		mutate.Addendum{Layer: base, History: v1.History{Created: when, CreatedBy: "imagebuild: users root and nonroot (" + strconv.Itoa(nonrootUID) + "), /tmp, CA bundle from golang.org/x/crypto/x509roots/fallback"}},
		mutate.Addendum{Layer: binLayer, History: v1.History{Created: when, CreatedBy: "imagebuild: " + binDir + "/" + binary + " " + o.version}},
	)
	if err != nil {
		return nil, fmt.Errorf("adding the layers: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = arch, "linux"
	cf.Created = when
	cf.Config = v1.Config{
		User:       fmt.Sprintf("%d:%d", nonrootUID, nonrootUID),
		Entrypoint: []string{binDir + "/" + binary},
		Env:        []string{"PATH=" + binDir + ":/usr/bin:/bin", "HOME=" + homeDir},
		Labels:     labels(binary, o, created),
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("setting the image config: %w", err)
	}
	return img, nil
}

// labels are the OCI annotations of an image, also its config's labels.
func labels(binary string, o options, created time.Time) map[string]string {
	l := map[string]string{
		"org.opencontainers.image.title":   binary,
		"org.opencontainers.image.source":  o.source,
		"org.opencontainers.image.version": o.version,
		"org.opencontainers.image.created": created.Format(time.RFC3339),
	}
	if o.revision != "" {
		l["org.opencontainers.image.revision"] = o.revision
	}
	return l
}
