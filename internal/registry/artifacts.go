package registry

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/errgroup"

	"github.com/imagepipe/imagepipe/internal/containerdisk"
)

// This file holds the protocol's primitives for a caller that reads and
// writes images itself, byte for byte (the gate): a manifest as stored, a
// blob by digest, a layer or blob pushed, a manifest put, and OCI 1.1
// referrers.

// RawManifest is a manifest or index as the registry stores it.
type RawManifest struct {
	// Digest is the sha256 of Bytes ("sha256:...").
	Digest string
	// MediaType is the registry's Content-Type for it.
	MediaType types.MediaType
	// Bytes are the manifest as stored, at most MaxIndexSize.
	Bytes []byte
}

// FetchManifest fetches the manifest ref names, at most MaxIndexSize
// bytes. A digest reference is checked against the bytes received.
func (c *Client) FetchManifest(ctx context.Context, ref name.Reference) (*RawManifest, error) {
	ropts, err := c.sessionOptions(ctx, ref.Context().Registry)
	if err != nil {
		return nil, err
	}
	desc, err := remote.Get(ref, ropts...)
	if err != nil {
		return nil, fmt.Errorf("fetching %s: %w", ref, err)
	}
	if len(desc.Manifest) > MaxIndexSize {
		return nil, fmt.Errorf("the manifest of %s is %d bytes, over the limit of %d", ref, len(desc.Manifest), MaxIndexSize)
	}
	sum := fmt.Sprintf("sha256:%x", sha256.Sum256(desc.Manifest))
	if d, ok := ref.(name.Digest); ok && d.DigestStr() != sum {
		return nil, fmt.Errorf("the registry answered %s with a manifest of digest %s", ref, sum)
	}
	return &RawManifest{Digest: sum, MediaType: desc.MediaType, Bytes: desc.Manifest}, nil
}

// OpenBlob streams the blob of repo with the given digest from the
// registry itself (never from a descriptor's urls or data). Reading it to
// its end checks the digest: a mismatch is an error from Read.
func (c *Client) OpenBlob(ctx context.Context, repo name.Repository, dgst string) (io.ReadCloser, error) {
	ropts, err := c.sessionOptions(ctx, repo.Registry)
	if err != nil {
		return nil, err
	}
	l, err := remote.Layer(repo.Digest(dgst), ropts...)
	if err != nil {
		return nil, fmt.Errorf("fetching blob %s: %w", dgst, err)
	}
	rc, err := l.Compressed()
	if err != nil {
		return nil, fmt.Errorf("fetching blob %s: %w", dgst, err)
	}
	return rc, nil
}

// PushLayer writes disk's layer into repo through a chunked upload and
// returns it. Nothing is kept for a later run: a failed push starts over.
func (c *Client) PushLayer(ctx context.Context, repo name.Repository, disk Disk) (containerdisk.LayerInfo, error) {
	layer, _, err := c.pushLayer(ctx, repo, nil, disk, ImportOptions{})
	return layer, err
}

// MountBlob makes the blob dgst of repository from exist in to: mounted
// across repositories where the registry allows it, else streamed from
// one to the other as stored, compressed, through this client. It does
// nothing when to has the blob already.
func (c *Client) MountBlob(ctx context.Context, from, to name.Repository, dgst string) error {
	ropts, err := c.sessionOptions(ctx, from.Registry)
	if err != nil {
		return err
	}
	src, err := remote.Layer(from.Digest(dgst), ropts...)
	if err != nil {
		return fmt.Errorf("fetching blob %s: %w", dgst, err)
	}
	layer := &remote.MountableLayer{Layer: src, Reference: from.Digest(dgst)}
	if err := remote.WriteLayer(to, layer, ropts...); err != nil {
		return fmt.Errorf("mounting blob %s from %s into %s: %w", dgst, from.RepositoryStr(), to.RepositoryStr(), err)
	}
	return nil
}

// PushBlob uploads a small blob (a config, a bundle) unless repo has it.
func (c *Client) PushBlob(ctx context.Context, repo name.Repository, mediaType string, b []byte) (ocispec.Descriptor, error) {
	return c.pushSmallBlob(ctx, repo, mediaType, b)
}

// MaxReferrers bounds the referrers of one digest that Referrers returns:
// anyone with push access can add referrers, and each costs a fetch.
const MaxReferrers = 64

// Referrers lists the manifests of subject's repository that refer to
// subject and have artifactType ("" for all), through the referrers API
// or, on registries without it, the referrers tag (sha256-HEX). A registry
// that answers with more than MaxReferrers is an error, not a partial
// list.
func (c *Client) Referrers(ctx context.Context, subject name.Digest, artifactType string) ([]v1.Descriptor, error) {
	refs, _, err := c.referrers(ctx, subject, artifactType)
	if err != nil {
		return nil, err
	}
	if len(refs) > MaxReferrers {
		return nil, fmt.Errorf("%s has %d referrers, over the limit of %d", subject, len(refs), MaxReferrers)
	}
	return refs, nil
}

// referrers is Referrers without the bound. In a repository whose
// registry answered that it lacks the referrers API, the referrers tag is
// read at once, as go-containerregistry would after the API's 404; tag is
// then the digest of the index it points at ("" when it points at none),
// and "" too when the listing came otherwise.
func (c *Client) referrers(ctx context.Context, subject name.Digest, artifactType string) (refs []v1.Descriptor, tag string, err error) {
	ropts, err := c.sessionOptions(ctx, subject.Registry)
	if err != nil {
		return nil, "", err
	}
	if c.lacksReferrersAPI(subject.RegistryStr() + "/" + subject.RepositoryStr()) {
		return referrersTag(subject, artifactType, ropts)
	}
	if artifactType != "" {
		ropts = append(ropts, remote.WithFilter("artifactType", artifactType))
	}
	idx, err := remote.Referrers(subject, ropts...)
	if err != nil {
		return nil, "", fmt.Errorf("listing the referrers of %s: %w", subject, err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, "", fmt.Errorf("listing the referrers of %s: %w", subject, err)
	}
	return m.Manifests, "", nil
}

// Artifact is one blob attached to a subject as an OCI 1.1 artifact: an
// image manifest with an empty config, the blob as its one layer, and the
// subject.
type Artifact struct {
	// ArtifactType is the manifest's artifactType.
	ArtifactType string
	// MediaType is the blob's media type.
	MediaType string
	// Content is the blob.
	Content []byte
	// Annotations go on the manifest.
	Annotations map[string]string
}

// emptyJSON is the OCI empty descriptor's content, "{}".
var emptyJSON = []byte("{}")

// Attached is what AttachArtifact attached.
type Attached struct {
	// Digest is the artifact's manifest digest.
	Digest string
	// ReferrersTag, on a registry without the referrers API, is the
	// digest of the referrers tag's index that was read back listing the
	// artifact: a push of the tag to this digest announces a listing this
	// client has seen. "" when unknown, and on registries with the API.
	ReferrersTag string
}

// AttachArtifact pushes a as a referrer of subject (whose manifest is
// subjectDesc) into subject's repository.
func (c *Client) AttachArtifact(ctx context.Context, subject name.Digest, subjectDesc ocispec.Descriptor, a Artifact) (Attached, error) {
	repo := subject.Context()
	rt, base, err := c.pushSession(ctx, repo)
	if err != nil {
		return Attached{}, err
	}
	layer := ocispec.Descriptor{MediaType: a.MediaType, Digest: digest.FromBytes(a.Content), Size: int64(len(a.Content))}
	var uploads errgroup.Group
	uploads.Go(func() error {
		return uploadSmallBlob(ctx, rt, base, repo, ocispec.DescriptorEmptyJSON.Digest, emptyJSON)
	})
	uploads.Go(func() error { return uploadSmallBlob(ctx, rt, base, repo, layer.Digest, a.Content) })
	if err := uploads.Wait(); err != nil {
		return Attached{}, err
	}
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
	d := digest.FromBytes(m).String()
	// A registry without the referrers API lists referrers in one index
	// under the referrers tag, which each writer reads, extends and writes
	// back: two writers at once can drop each other's entry. The listing
	// is read back, and the manifest pushed again (which extends the index
	// again) until it lists d.
	for attempt := 1; ; attempt++ {
		if err := remote.Put(repo.Digest(d), rawManifest{m, types.OCIManifestSchema1}, remote.WithContext(ctx), remote.WithTransport(rt)); err != nil {
			return Attached{}, fmt.Errorf("pushing the manifest to %s: %w", repo.Digest(d), err)
		}
		refs, tag, err := c.referrers(ctx, subject, "")
		if err != nil {
			return Attached{}, err
		}
		if slices.ContainsFunc(refs, func(r v1.Descriptor) bool { return r.Digest.String() == d }) {
			return Attached{Digest: d, ReferrersTag: tag}, nil
		}
		if attempt == attachAttempts {
			return Attached{}, fmt.Errorf("the registry does not list %s among the referrers of %s after %d pushes", d, subject, attempt)
		}
		select {
		case <-ctx.Done():
			return Attached{}, ctx.Err()
		case <-time.After(time.Duration(attempt*(10+rand.IntN(40))) * time.Millisecond):
		}
	}
}

// attachAttempts bounds the pushes of one referrer (see AttachArtifact).
const attachAttempts = 5
