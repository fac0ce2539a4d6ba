package registry

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// DeleteOptions say how Delete treats an image other tags still name. The
// zero value refuses to delete it.
type DeleteOptions struct {
	// Force deletes the image even when other tags point to it; they go too.
	Force bool
}

// Deleted is what Delete removed.
type Deleted struct {
	// Digest is the manifest that was deleted.
	Digest name.Digest
	// Tags are the tags (build-key tags left out) that pointed to it, and
	// which the registry removed with it.
	Tags []string
}

// SharedImageError is Delete's refusal to delete, through one tag, an image
// that other tags also name.
type SharedImageError struct {
	// Ref is the tag the caller asked to delete.
	Ref name.Tag
	// Digest is the image it points to.
	Digest string
	// Others are the other tags pointing to Digest.
	Others []string
}

func (e *SharedImageError) Error() string {
	return fmt.Sprintf("%s is the image %s, which is also tagged %s; deleting it removes every tag", e.Ref, e.Digest, strings.Join(e.Others, ", "))
}

// Delete deletes the image ref names. Registries delete manifests by
// digest, which removes every tag pointing to it, so a tag is resolved to
// its digest first and, unless opts.Force, Delete refuses with a
// *SharedImageError when other tags (build-key tags aside) point to the same
// image. A digest reference is deleted as asked.
func (c *Client) Delete(ctx context.Context, ref name.Reference, opts DeleteOptions) (*Deleted, error) {
	ropts, err := c.remoteOptions(ctx, ref.Context().Registry)
	if err != nil {
		return nil, err
	}
	digest, ok := ref.(name.Digest)
	if !ok {
		desc, err := remote.Head(ref, ropts...)
		if err != nil {
			return nil, fmt.Errorf("resolving %s: %w", ref, err)
		}
		digest = ref.Context().Digest(desc.Digest.String())
	}
	tags, err := c.tagsOf(ctx, digest)
	if err != nil {
		return nil, err
	}
	if tag, ok := ref.(name.Tag); ok && !opts.Force {
		others := slices.DeleteFunc(slices.Clone(tags), func(t string) bool { return t == tag.TagStr() })
		if len(others) > 0 {
			return nil, &SharedImageError{Ref: tag, Digest: digest.DigestStr(), Others: others}
		}
	}
	if err := remote.Delete(digest, ropts...); err != nil {
		return nil, fmt.Errorf("deleting %s: %w", digest, err)
	}
	c.opts.logger.Info("deleted", "digest", digest.String(), "tags", tags)
	return &Deleted{Digest: digest, Tags: tags}, nil
}

// tagsOf returns the sorted tags of digest's repository, build-key tags
// left out, that point to digest.
func (c *Client) tagsOf(ctx context.Context, digest name.Digest) ([]string, error) {
	all, err := c.tagDigests(ctx, digest.Context())
	if err != nil {
		return nil, err
	}
	var tags []string
	for tag, d := range all {
		if d == digest.DigestStr() {
			tags = append(tags, tag)
		}
	}
	slices.Sort(tags)
	return tags, nil
}
