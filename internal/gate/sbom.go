package gate

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/imagepipe/imagepipe/internal/attest"
	"github.com/imagepipe/imagepipe/internal/containerdisk"
	"github.com/imagepipe/imagepipe/internal/guest"
	"github.com/imagepipe/imagepipe/internal/ocidoc"
	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/internal/verdict"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// packagesRecord is the package list of a layer's guest, written by the
// process that read the layer (a verification child) beside its
// layerRecord, under the same key: the gate writes the guest's SBOM from
// it, for every image naming the layer, without reading it again.
type packagesRecord struct {
	Key      string          `json:"key"`
	OS       *api.GuestOS    `json:"os,omitempty"`
	Packages []guest.Package `json:"packages"`
}

// maxPackagesRecord bounds a package list kept and read back: dpkg's
// status file, its source, is at most 16 MiB, and its list is smaller
// unless its bytes need escaping in JSON (a control byte takes 6).
const maxPackagesRecord = 24 << 20

// putPackages keeps rec, unless its JSON could pass maxPackagesRecord:
// that is known before encoding it, so that a hostile list costs the
// verification child no more memory than the bound.
func (s *Store) putPackages(rec *packagesRecord) error {
	if n := packagesJSONBound(rec.Packages); n > maxPackagesRecord {
		return fmt.Errorf("the package list may take %d bytes as JSON, over the bound of %d", n, maxPackagesRecord)
	}
	return s.write("packages", rec.Key, rec)
}

// packagesJSONBound is at least the length of pkgs as JSON: 6 bytes for
// each byte that may be escaped (control bytes, <, >, &, non-ASCII), 1 for
// any other, and 128 for each package's keys and punctuation.
func packagesJSONBound(pkgs []guest.Package) int64 {
	n := int64(64)
	for _, p := range pkgs {
		n += 128
		for _, f := range []string{p.Type, p.Name, p.Version, p.Epoch, p.Arch, p.Source} {
			for i := 0; i < len(f); i++ {
				if c := f[i]; c < 0x20 || c >= 0x7f || c == '<' || c == '>' || c == '&' || c == '"' || c == '\\' {
					n += 6
				} else {
					n++
				}
			}
		}
	}
	return n
}

// packages returns the package list kept under key, if the store has it.
func (s *Store) packages(key string) (*packagesRecord, bool) {
	var rec packagesRecord
	if s == nil || !s.readFileLimit(s.path("packages", key), maxPackagesRecord, &rec) || rec.Key != key {
		return nil, false
	}
	return &rec, true
}

// sbom is the SBOM of one image of a verdict, to attach to its manifest.
type sbom struct {
	image name.Digest
	desc  ocispec.Descriptor
	bom   []byte
}

// sboms writes the CycloneDX SBOM of each image v accepts whose guest's
// packages were listed, from the package lists in the Store (no layer is
// read): its subject is the image's pushed manifest, raw for subject
// itself, fetched for an index's images. An image whose list the Store
// no longer has, or whose SBOM would pass guest.MaxBOMSize, gets none
// (logged).
func (v *Verifier) sboms(ctx context.Context, subject name.Digest, raw *registry.RawManifest, vd *api.Verdict) ([]sbom, error) {
	if vd.Verdict != api.VerdictAccepted || v.Store == nil {
		return nil, nil
	}
	var out []sbom
	for _, im := range vd.Images {
		if im.Guest == nil || im.Guest.Packages == nil {
			continue
		}
		image := subject.Context().Digest(im.Source)
		m := raw
		if im.Source != raw.Digest {
			var err error
			if m, err = v.Registry.FetchManifest(ctx, image); err != nil {
				return nil, err
			}
		}
		doc, err := ocidoc.ParseDocument(string(m.MediaType), m.Bytes)
		if err != nil || doc.IsIndex() || len(doc.Layers) != 1 {
			return nil, fmt.Errorf("reading the manifest of %s again for its SBOM: %v", image, err)
		}
		layer := doc.Layers[0].Descriptor
		comp, err := containerdisk.CompressionOf(layer.MediaType)
		if err != nil {
			return nil, err
		}
		rec, ok := v.Store.packages(layerKey(layer.Digest, comp, v.maxVirtualSize(), v.Version))
		if !ok {
			v.logger().Warn("no SBOM: the store no longer has the layer's packages", "image", image.String(), "layer", layer.Digest)
			continue
		}
		b, err := guest.BOM(guest.BOMSubject{Digest: im.Source, Repository: subject.Context().Name()}, rec.OS, rec.Packages, vd.VerifiedAt)
		if errors.Is(err, guest.ErrBOMTooLarge) {
			v.logger().Warn("no SBOM: it is over its bound", "image", image.String(), "error", err)
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, sbom{image: image, bom: b,
			desc: ocispec.Descriptor{MediaType: string(m.MediaType), Digest: digest.Digest(m.Digest), Size: int64(len(m.Bytes))}})
	}
	return out, nil
}

// publishSBOMs signs and attaches the SBOMs of v's images (Verifier.sboms)
// as CycloneDX attestations, before v itself: a verdict that stands is
// not published again, so an SBOM that failed to attach is tried again
// with it.
func (s *Service) publishSBOMs(ctx context.Context, subject name.Digest, raw *registry.RawManifest, v *api.Verdict) error {
	boms, err := s.Verifier.sboms(ctx, subject, raw, v)
	if err != nil {
		return err
	}
	repoName := subject.Context().RepositoryStr()
	for _, b := range boms {
		att, err := verdict.PublishStatement(ctx, s.Registry, s.Signer, b.image, b.desc, attest.CycloneDXPredicateType, b.bom, v.VerifiedAt)
		if err != nil {
			return fmt.Errorf("publishing the SBOM of %s: %w", b.image, err)
		}
		s.own.add(repoName + "@" + att.Digest)
		s.Logger.Info("SBOM published", "image", b.image.String(), "referrer", att.Digest, "bytes", len(b.bom))
	}
	return nil
}
