package verdict

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/errgroup"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/content"
)

// Artifact is one blob to attach to a subject as an OCI 1.1 artifact: an
// image manifest with the empty config, the blob as its one layer, and
// the subject.
type Artifact struct {
	// ArtifactType is the manifest's artifactType.
	ArtifactType string
	// MediaType is the blob's media type.
	MediaType string
	// Content is the blob.
	Content []byte
	// Annotations go on the manifest, and with it into the subject's
	// referrers listing.
	Annotations map[string]string
}

// Attached is what Attach attached.
type Attached struct {
	// Digest is the artifact's manifest digest.
	Digest string
	// ReferrersTag, on a registry without the referrers API, is the
	// digest of the referrers tag's index that was read back listing the
	// artifact: a push of the tag to this digest announces a listing that
	// holds it. "" on registries with the API.
	ReferrersTag string
}

// attachPushes bounds the pushes of one artifact's manifest (see Attach).
const attachPushes = 5

// Attach pushes a into subject's repository as a referrer of subject,
// whose manifest subjectDesc describes, with oras-go. The manifest is the
// same bytes for the same artifact and subject, so attaching twice adds
// one referrer.
//
// A registry without the referrers API lists referrers in one index under
// the referrers tag, which each writer reads, extends and writes back: two
// writers at once can drop each other's entry. So the listing is read
// back, and the manifest pushed again (which makes oras-go extend the
// index again) until it lists the artifact, at most attachPushes times.
func Attach(ctx context.Context, reg Registry, subject name.Digest, subjectDesc ocispec.Descriptor, a Artifact) (Attached, error) {
	repo, err := reg.ORASRepository(ctx, subject.Context())
	if err != nil {
		return Attached{}, err
	}
	var layer ocispec.Descriptor
	var blobs errgroup.Group
	blobs.Go(func() error {
		_, err := oras.PushBytes(ctx, repo.Blobs(), ocispec.MediaTypeEmptyJSON, ocispec.DescriptorEmptyJSON.Data)
		return err
	})
	blobs.Go(func() (err error) {
		layer, err = oras.PushBytes(ctx, repo.Blobs(), a.MediaType, a.Content)
		return err
	})
	if err := blobs.Wait(); err != nil {
		return Attached{}, fmt.Errorf("pushing the blobs of an artifact of %s: %w", subject, err)
	}
	// Built here rather than by oras.PackManifest, which stamps a creation
	// time when none is given: a signature made again by a deterministic
	// key (ed25519) would then be a new referrer each time.
	m, err := json.Marshal(ocispec.Manifest{
		Versioned:    specs.Versioned{SchemaVersion: 2},
		MediaType:    ocispec.MediaTypeImageManifest,
		ArtifactType: a.ArtifactType,
		Config:       ocispec.DescriptorEmptyJSON,
		Layers:       []ocispec.Descriptor{layer},
		Subject:      &subjectDesc,
		Annotations:  a.Annotations,
	})
	if err != nil {
		return Attached{}, err
	}
	desc := content.NewDescriptorFromBytes(ocispec.MediaTypeImageManifest, m)
	d := desc.Digest.String()
	for push := 1; ; push++ {
		if err := repo.Push(ctx, desc, bytes.NewReader(m)); err != nil {
			return Attached{}, fmt.Errorf("pushing the manifest to %s: %w", subject.Context().Digest(d), err)
		}
		refs, tag, err := reg.Referrers(ctx, subject, "")
		if err != nil {
			return Attached{}, err
		}
		if slices.ContainsFunc(refs, func(r v1.Descriptor) bool { return r.Digest.String() == d }) {
			return Attached{Digest: d, ReferrersTag: tag}, nil
		}
		if push == attachPushes {
			return Attached{}, fmt.Errorf("the registry does not list %s among the referrers of %s after %d pushes", d, subject, push)
		}
		select {
		case <-ctx.Done():
			return Attached{}, ctx.Err()
		case <-time.After(time.Duration(push*(10+rand.IntN(40))) * time.Millisecond):
		}
	}
}
