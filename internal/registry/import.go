package registry

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/imagepipe/imagepipe/internal/convert"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// Source is a validated disk image and what is known of where it came from.
type Source struct {
	// Image is the opened, validated disk.
	Image *convert.Image
	// Digest is the sha256 of the original bytes ("sha256:<hex>"), or ""
	// while WaitDigest is still computing it.
	Digest string
	// WaitDigest, when Digest is "", returns the digest once known.
	WaitDigest func(context.Context) (string, error)
	// UploadName, when set, names the layer upload so that a later run can
	// resume it even when this one was interrupted before the digest was
	// known: e.g. a local file's path, device, inode, size and times. A
	// name that matches another content costs only a fresh upload: the
	// registry checks the layer's digest before it accepts it.
	UploadName string
}

// ErrResumable marks an import that stopped (interrupted, or the registry
// or the network failed) with its upload session kept and recorded, so
// that running the same import again resumes it.
var ErrResumable = errors.New("the upload is kept for a later run")

// resumableError wraps an import's error when its upload can be resumed.
type resumableError struct{ err error }

func (e *resumableError) Error() string        { return e.err.Error() }
func (e *resumableError) Unwrap() error        { return e.err }
func (e *resumableError) Is(target error) bool { return target == ErrResumable }

// ImportOptions describe the containerDisk to build. The zero value builds
// a gzip-compressed qcow2 disk for linux/amd64.
type ImportOptions struct {
	// DiskFormat is the format of disk/disk.img: FormatQCOW2 (default) or FormatRaw.
	DiskFormat convert.Format
	// Compression of the layer; default gzip.
	Compression Compression
	// Architecture and OS of the image config; default amd64 and linux.
	Architecture, OS string
	// Labels are added to the image config.
	Labels map[string]string
	// DefaultInstancetype and DefaultPreference become the config
	// environment variables CDI turns into volume labels.
	DefaultInstancetype, DefaultPreference string
	// OSName is recorded in the annotations when set.
	OSName string
	// Created is recorded when non-zero; by default images carry no time,
	// so that they are reproducible.
	Created time.Time
	// Creator names the building tool and version.
	Creator string
	// Progress, when set, is called with uncompressed layer bytes done and
	// the total as the layer is built.
	Progress func(done, total int64)
}

func (o ImportOptions) withDefaults() (ImportOptions, error) {
	if o.DiskFormat == "" {
		o.DiskFormat = convert.FormatQCOW2
	}
	if o.DiskFormat != convert.FormatQCOW2 && o.DiskFormat != convert.FormatRaw {
		return o, fmt.Errorf("unsupported disk format %q (qcow2 or raw)", o.DiskFormat)
	}
	var err error
	if o.Compression, err = ParseCompression(string(o.Compression)); err != nil {
		return o, err
	}
	if o.Architecture == "" {
		o.Architecture = "amd64"
	}
	if o.OS == "" {
		o.OS = "linux"
	}
	return o, nil
}

// buildKey identifies an image by everything that determines its bytes.
func buildKey(sourceDigest string, o ImportOptions) string {
	b, _ := json.Marshal(struct {
		Version            int               `json:"v"`
		Source             string            `json:"source"`
		DiskFormat         convert.Format    `json:"disk"`
		Compression        Compression       `json:"compression"`
		Arch, OS           string            `json:",omitempty"`
		Labels             map[string]string `json:"labels,omitempty"`
		Instancetype, Pref string            `json:",omitempty"`
		OSName, Creator    string            `json:",omitempty"`
		Created            string            `json:",omitempty"`
		Gzip               string            `json:",omitempty"` // the compressor decides the bytes
	}{1, sourceDigest, o.DiskFormat, o.Compression, o.Architecture, o.OS, o.Labels,
		o.DefaultInstancetype, o.DefaultPreference, o.OSName, o.Creator, formatCreated(o.Created), gzipName(o.Compression)})
	return fmt.Sprintf("sha256:%x", sha256.Sum256(b))
}

// gzipName is the gzip implementation when the layer is gzip-compressed.
func gzipName(c Compression) string {
	if c == CompressionGzip {
		return gzipImplementation
	}
	return ""
}

func formatCreated(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}

// Import builds a containerDisk from src and pushes it to ref. When this
// machine's build record says it already pushed the same build (same
// source digest and options) to this registry, and the registry still
// holds exactly that manifest and its blobs, the image is only tagged (or,
// from another repository, copied by mounting its blobs); anything else is
// built anew, whatever the registry's tags say. A rejection of the disk (a *convert.RejectError) leaves nothing
// behind; a network failure leaves a resumable upload.
//
// When src's digest is still being computed (Source.WaitDigest), the build
// starts at once and the look-up for an identical image happens as soon as
// the digest is known; finding one stops the build.
func (c *Client) Import(ctx context.Context, ref name.Tag, src Source, opts ImportOptions) (*api.ImportResult, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if _, err := Tenant(ref.Context()); err != nil {
		return nil, err
	}
	if src.Digest != "" || src.WaitDigest == nil {
		key := buildKey(src.Digest, opts)
		if res, err := c.findExisting(ctx, ref, key, src, opts); err != nil || res != nil {
			return res, err
		}
		upload := knownKey(key)
		if src.UploadName != "" {
			upload = knownKey(uploadNameKey(src.UploadName, opts))
		}
		b, err := c.build(ctx, ref, upload, src, opts)
		if err != nil {
			return nil, err
		}
		return c.publish(ctx, ref, key, src.Digest, src, opts, b)
	}

	// Hash and build at the same time.
	buildCtx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	type found struct {
		digest string
		res    *api.ImportResult
		err    error
	}
	lookup := make(chan found, 1)
	later := new(uploadKey)
	named := src.UploadName != ""
	if named {
		later.set(uploadNameKey(src.UploadName, opts))
	}
	go func() {
		d, err := src.WaitDigest(buildCtx)
		if err != nil {
			lookup <- found{err: err}
			stop(err)
			return
		}
		key := buildKey(d, opts)
		res, err := c.findExisting(buildCtx, ref, key, Source{Image: src.Image, Digest: d}, opts)
		if res == nil && err == nil && !named {
			later.set(key) // the upload can now be resumed by a later run
		}
		lookup <- found{digest: d, res: res, err: err}
		switch {
		case res != nil:
			stop(errFoundExisting)
		case err != nil:
			stop(err)
		}
	}()
	b, buildErr := c.build(buildCtx, ref, later, src, opts)
	if buildErr != nil && !errors.Is(context.Cause(buildCtx), errFoundExisting) {
		if cause := context.Cause(buildCtx); cause != nil {
			if errors.Is(buildErr, ErrResumable) {
				return nil, &resumableError{cause}
			}
			return nil, cause // hashing failed, or the caller gave up
		}
		return nil, buildErr
	}
	f := <-lookup
	switch {
	case f.err != nil:
		return nil, f.err
	case f.res != nil:
		return f.res, nil
	case buildErr != nil:
		return nil, buildErr
	}
	return c.publish(ctx, ref, buildKey(f.digest, opts), f.digest, src, opts, b)
}

// uploadNameKey names the upload of a source known by name (see
// Source.UploadName) rather than by digest, with everything else that
// decides the layer's bytes.
func uploadNameKey(uploadName string, o ImportOptions) string {
	return buildKey("name:"+uploadName, o)
}

// errFoundExisting stops a build that an identical image made unnecessary.
var errFoundExisting = errors.New("an identical image exists")

// findExisting returns the result of reusing an image this machine
// already built with key (see builds.go), or nil when there is none that
// the registry still fully holds.
func (c *Client) findExisting(ctx context.Context, ref name.Tag, key string, src Source, opts ImportOptions) (*api.ImportResult, error) {
	for _, rec := range c.lookupBuilds(key, ref.RegistryStr(), ref.RepositoryStr()) {
		result := newResult(ref, src, opts)
		found, err := c.reuseBuild(ctx, ref, rec, result)
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		if err != nil {
			c.opts.logger.Debug("reusing an earlier build failed; building", "repository", rec.Repository, "digest", rec.Digest, "error", err)
			continue
		}
		if found {
			return result, nil
		}
	}
	return nil, nil
}

func newResult(ref name.Tag, src Source, opts ImportOptions) *api.ImportResult {
	return &api.ImportResult{
		Reference: ref.String(), SourceDigest: src.Digest,
		VirtualSize: src.Image.Info().VirtualSize, DiskFormat: string(opts.DiskFormat),
	}
}

// built is a layer in the registry and what is known of its disk.
type built struct {
	layer     layerInfo
	sent      int64
	allocated int64
}

// build validates the allocation map, then builds and uploads the layer.
// key names the upload for resuming, possibly only later.
func (c *Client) build(ctx context.Context, ref name.Tag, key *uploadKey, src Source, opts ImportOptions) (built, error) {
	// Walk the whole allocation map before anything is sent: an invalid
	// L2 table is refused with nothing uploaded.
	summary, err := src.Image.Map(ctx)
	if err != nil {
		return built{}, err
	}
	plan, err := src.Image.Plan(ctx, convert.Options{To: opts.DiskFormat, Logger: c.opts.logger})
	if err != nil {
		return built{}, err
	}
	layer, sent, err := c.pushLayer(ctx, ref.Context(), key, plan, opts)
	if errors.Is(err, errUploadLost) {
		c.opts.logger.Info("upload session lost; sending the layer again", "reference", ref.String(), "error", err)
		var again int64
		layer, again, err = c.pushLayer(ctx, ref.Context(), key, plan, opts)
		sent += again
	}
	allocated := summary.AllocatedBytes // raw output: the source's allocation
	if n, ok := plan.DataBytes(); ok {
		allocated = n // qcow2 output: content-defined, so digests do not depend on the filesystem
	}
	return built{layer: layer, sent: sent, allocated: allocated}, err
}

// publish pushes the config and the manifest, which writes the build-key
// tag and then ref.
func (c *Client) publish(ctx context.Context, ref name.Tag, key, sourceDigest string, src Source, opts ImportOptions, b built) (*api.ImportResult, error) {
	info := src.Image.Info()
	annotations := map[string]string{
		api.AnnotationSourceDigest:  sourceDigest,
		api.AnnotationSourceFormat:  string(info.Format),
		api.AnnotationDiskFormat:    string(opts.DiskFormat),
		api.AnnotationVirtualSize:   strconv.FormatInt(info.VirtualSize, 10),
		api.AnnotationAllocatedSize: strconv.FormatInt(b.allocated, 10),
		api.AnnotationBuildKey:      key,
	}
	if opts.Creator != "" {
		annotations[api.AnnotationCreator] = opts.Creator
	}
	if opts.OSName != "" {
		annotations[api.AnnotationOSName] = opts.OSName
	}
	if !opts.Created.IsZero() {
		annotations[api.AnnotationCreated] = formatCreated(opts.Created)
	}
	config, err := imageConfig(opts, annotations, b.layer)
	if err != nil {
		return nil, err
	}
	configDesc, err := c.pushSmallBlob(ctx, ref.Context(), ocispec.MediaTypeImageConfig, config)
	if err != nil {
		return nil, err
	}
	manifest, err := json.Marshal(ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageManifest,
		Config:    configDesc,
		Layers: []ocispec.Descriptor{{
			MediaType: opts.Compression.mediaType(),
			Digest:    digest.Digest(b.layer.digest),
			Size:      b.layer.size,
		}},
		Annotations: annotations,
	})
	if err != nil {
		return nil, err
	}
	// Blobs are committed; now the manifest, which writes the tag.
	if err := c.putManifest(ctx, ref, manifest); err != nil {
		return nil, err
	}
	result := newResult(ref, src, opts)
	result.SourceDigest = sourceDigest
	result.LayerSize, result.UploadedBytes = b.layer.size, b.sent
	result.Digest = fmt.Sprintf("sha256:%x", sha256.Sum256(manifest))
	result.Pinned = ref.Context().Digest(result.Digest).String()
	c.rememberBuild(buildRecord{Key: key, Registry: ref.RegistryStr(), Repository: ref.RepositoryStr(), Digest: result.Digest,
		Config: configDesc.Digest.String(), Layer: b.layer.digest, LayerSize: b.layer.size})
	c.opts.logger.Info("imported", "reference", ref.String(), "digest", result.Digest, "bytes", b.layer.size)
	return result, nil
}

// reuseBuild writes ref from the image rec records, after checking that
// the registry holds exactly that manifest (fetched by digest, so its
// bytes are the ones pushed) with the recorded config and layer, and both
// blobs in rec's repository. When rec is in another repository of the
// registry, the image is copied into ref's, mounting the blobs. It
// reports false, forgetting rec, when the registry no longer holds it
// all; the caller then builds.
func (c *Client) reuseBuild(ctx context.Context, ref name.Tag, rec buildRecord, result *api.ImportResult) (bool, error) {
	from, err := name.NewDigest(rec.Registry+"/"+rec.Repository+"@"+rec.Digest, c.nameOptions()...)
	if err != nil {
		return false, err
	}
	manifest, ok, err := c.checkBuild(ctx, from, rec)
	if err != nil || !ok {
		if err == nil {
			c.forgetBuild(rec)
		}
		return false, err
	}
	if rec.Repository == ref.RepositoryStr() {
		err = c.putManifest(ctx, ref, manifest)
	} else {
		_, err = c.Copy(ctx, from, ref)
	}
	if err != nil {
		var terr *transport.Error
		if errors.As(err, &terr) && terr.StatusCode == http.StatusBadRequest {
			return false, nil // a blob went in the meantime: build
		}
		return false, err
	}
	rec.Repository = ref.RepositoryStr()
	c.rememberBuild(rec)
	result.Digest = rec.Digest
	result.Pinned = ref.Context().Digest(rec.Digest).String()
	result.Reused = true
	result.LayerSize = rec.LayerSize
	return true, nil
}

// checkBuild fetches the manifest at pinned (go-containerregistry checks
// that its bytes have the digest) and checks that it is the one rec
// describes and that its repository holds the config and the layer. ok is
// false when something is missing or different.
func (c *Client) checkBuild(ctx context.Context, pinned name.Digest, rec buildRecord) (manifest []byte, ok bool, err error) {
	ropts, err := c.remoteOptions(ctx, pinned.Registry)
	if err != nil {
		return nil, false, err
	}
	desc, err := remote.Get(pinned, ropts...)
	var terr *transport.Error
	if errors.As(err, &terr) && terr.StatusCode == http.StatusNotFound {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("fetching %s: %w", pinned, err)
	}
	if desc.Digest.String() != rec.Digest {
		return nil, false, fmt.Errorf("%s answered with manifest %s", pinned, desc.Digest)
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(desc.Manifest, &m); err != nil || len(m.Layers) != 1 ||
		m.Config.Digest.String() != rec.Config || m.Layers[0].Digest.String() != rec.Layer ||
		m.Layers[0].Size != rec.LayerSize || m.Annotations[api.AnnotationBuildKey] != rec.Key {
		return nil, false, nil
	}
	client, base, err := c.httpClient(ctx, pinned.Context(), pinned.Context().Scope(transport.PullScope))
	if err != nil {
		return nil, false, err
	}
	baseURL, err := url.Parse(base)
	if err != nil {
		return nil, false, err
	}
	for _, d := range []string{rec.Config, rec.Layer} {
		exists, err := c.blobExists(ctx, client, baseURL, pinned.Context(), d)
		if err != nil || !exists {
			return nil, false, err
		}
	}
	return desc.Manifest, true, nil
}

// pushLayer builds the layer and streams it into a resumable upload.
// It returns the layer and how many bytes this run sent.
func (c *Client) pushLayer(ctx context.Context, repo name.Repository, key *uploadKey, plan *convert.Plan, opts ImportOptions) (layerInfo, int64, error) {
	up, err := c.startUpload(ctx, repo, key)
	if err != nil {
		return layerInfo{}, 0, err
	}
	up.run(ctx)
	var tarIn io.Writer
	if opts.Progress != nil {
		total := plan.Size() + 3*512 // two headers and the padding before the end
		tarIn = &progressWriter{fn: opts.Progress, total: total}
	}
	layer, err := buildLayer(ctx, plan, opts.Compression, up, tarIn)
	if err == nil {
		err = up.finish()
	} else {
		up.abort()
	}
	if err == nil {
		err = up.commit(ctx, layer.digest)
	}
	if err != nil {
		if convert.AsReject(err) != nil || errors.Is(context.Cause(ctx), errFoundExisting) {
			// Rejected or not needed: its bytes must not stay on the registry.
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			up.cancel(cctx)
			cancel()
			return layerInfo{}, up.sent, err
		}
		// Interrupted or failed: the session stays, for a later run.
		if !errors.Is(err, errUploadLost) && up.saveState() {
			err = &resumableError{err}
		}
		return layerInfo{}, up.sent, err
	}
	c.opts.logger.Debug("layer uploaded", "digest", layer.digest, "bytes", layer.size, "sent", up.sent, "resent", up.resent)
	return layer, up.sent, nil
}

// progressWriter reports bytes that pass through it.
type progressWriter struct {
	fn          func(done, total int64)
	done, total int64
}

func (p *progressWriter) Write(b []byte) (int, error) {
	p.done += int64(len(b))
	p.fn(p.done, p.total)
	return len(b), nil
}

// imageConfig is the OCI image config: platform, labels (the annotations
// plus the user's), the instancetype environment and the layer's diff ID.
func imageConfig(o ImportOptions, annotations map[string]string, layer layerInfo) ([]byte, error) {
	labels := maps.Clone(annotations)
	maps.Copy(labels, o.Labels)
	var env []string
	if o.DefaultInstancetype != "" {
		env = append(env, api.EnvDefaultInstancetype+"="+o.DefaultInstancetype)
	}
	if o.DefaultPreference != "" {
		env = append(env, api.EnvDefaultPreference+"="+o.DefaultPreference)
	}
	cfg := ocispec.Image{
		Platform: ocispec.Platform{Architecture: o.Architecture, OS: o.OS},
		Config:   ocispec.ImageConfig{Labels: labels, Env: env},
		RootFS:   ocispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{digest.Digest(layer.diffID)}},
	}
	if !o.Created.IsZero() {
		t := o.Created.UTC().Truncate(time.Second)
		cfg.Created = &t
	}
	return json.Marshal(cfg)
}

// rawManifest lets go-containerregistry put manifest bytes as they are.
type rawManifest struct{ b []byte }

func (m rawManifest) RawManifest() ([]byte, error) { return m.b, nil }
func (m rawManifest) MediaType() (types.MediaType, error) {
	return types.OCIManifestSchema1, nil
}

func (c *Client) putManifest(ctx context.Context, ref name.Tag, manifest []byte) error {
	ropts, err := c.remoteOptions(ctx, ref.Registry)
	if err != nil {
		return err
	}
	if err := remote.Put(ref, rawManifest{manifest}, ropts...); err != nil {
		return fmt.Errorf("pushing the manifest to %s: %w", ref, err)
	}
	return nil
}
