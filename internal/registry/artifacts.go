package registry

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
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

// mountBlob makes the blob dgst of repository from exist in to: mounted
// across repositories where the registry allows it, else streamed from
// one to the other as stored, compressed, through this client. It does
// nothing when to has the blob already.
func (c *Client) mountBlob(ctx context.Context, from, to name.Repository, dgst string) error {
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

// MaxReferrers bounds the referrers of one digest that Referrers returns:
// anyone with push access can add referrers, and each costs a fetch.
const MaxReferrers = 64

// Referrers lists the manifests of subject's repository that refer to
// subject and have artifactType ("" for all), through the referrers API
// or, on registries without it, the referrers tag (sha256-HEX). tag is the
// digest of the referrers tag's index the listing was read from: a push
// of the tag to that digest announces this listing. It is "" when the
// listing came from the API or the tag does not exist. A registry that
// answers with more than MaxReferrers is an error, not a partial list.
func (c *Client) Referrers(ctx context.Context, subject name.Digest, artifactType string) (refs []v1.Descriptor, tag string, err error) {
	refs, tag, err = c.referrers(ctx, subject, artifactType)
	if err != nil {
		return nil, "", err
	}
	if len(refs) > MaxReferrers {
		return nil, "", fmt.Errorf("%s has %d referrers, over the limit of %d", subject, len(refs), MaxReferrers)
	}
	return refs, tag, nil
}

// referrers is Referrers without the bound. In a repository whose
// registry answered that it lacks the referrers API, the referrers tag is
// read at once, as go-containerregistry would after the API's 404.
func (c *Client) referrers(ctx context.Context, subject name.Digest, artifactType string) (refs []v1.Descriptor, tag string, err error) {
	ropts, err := c.sessionOptions(ctx, subject.Registry)
	if err != nil {
		return nil, "", err
	}
	repo := subject.RegistryStr() + "/" + subject.RepositoryStr()
	if c.lacksReferrersAPI(repo) {
		return referrersTag(subject, artifactType, ropts)
	}
	if artifactType != "" {
		ropts = append(ropts, remote.WithFilter("artifactType", artifactType))
	}
	idx, err := remote.Referrers(subject, ropts...)
	if err != nil {
		return nil, "", fmt.Errorf("listing the referrers of %s: %w", subject, err)
	}
	if c.lacksReferrersAPI(repo) {
		// The API answered 404 just now and go-containerregistry read the
		// tag without saying at which digest: read it again to know.
		return referrersTag(subject, artifactType, ropts)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, "", fmt.Errorf("listing the referrers of %s: %w", subject, err)
	}
	return m.Manifests, "", nil
}
