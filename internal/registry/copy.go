package registry

import (
	"context"
	"fmt"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// CopyOptions say what Copy copies. The zero value copies whatever src
// names, an image index with every image it lists.
type CopyOptions struct {
	// Platform, when set, copies only src's image for that platform: from
	// an index, its one image for it (as CheckContainerDisk resolves it:
	// none, several, or one whose config names another platform are
	// reject.PlatformMismatch); an image outside an index must be built
	// for it. dst then holds that image, not an index.
	Platform *Platform
}

// Copy copies the image (or image index, within MaxIndexSize and
// MaxIndexEntries) at src to dst, which may be on another registry, and
// returns dst pinned by digest. The manifest is
// copied byte for byte, so the digest stays the same; blobs dst already
// holds are skipped, and on the same registry they are mounted from src's
// repository instead of sent. When this machine built the image (its
// build record has the digest), dst is added to the record, so that
// importing the same source into dst's repository only tags.
func (c *Client) Copy(ctx context.Context, src, dst name.Reference, opts CopyOptions) (name.Digest, error) {
	srcOpts, err := c.remoteOptions(ctx, src.Context().Registry)
	if err != nil {
		return name.Digest{}, err
	}
	dstOpts, err := c.remoteOptions(ctx, dst.Context().Registry)
	if err != nil {
		return name.Digest{}, err
	}
	var desc *remote.Descriptor
	if opts.Platform != nil {
		if err := opts.Platform.Validate(); err != nil {
			return name.Digest{}, err
		}
		res, err := c.resolve(ctx, src, *opts.Platform, true, opts.Platform.String()+" was asked for")
		if err != nil {
			return name.Digest{}, err
		}
		desc = res.desc
	} else if desc, err = remote.Get(src, srcOpts...); err != nil {
		return name.Digest{}, fmt.Errorf("fetching %s: %w", src, err)
	}
	if d, ok := dst.(name.Digest); ok && d.DigestStr() != desc.Digest.String() {
		return name.Digest{}, fmt.Errorf("%s is %s, not the digest %s names", src, desc.Digest, dst)
	}
	if desc.MediaType.IsIndex() {
		if _, err := parseIndex(desc.Manifest); err != nil {
			return name.Digest{}, fmt.Errorf("copying %s: %w", src, err)
		}
		idx, err := desc.ImageIndex()
		if err != nil {
			return name.Digest{}, err
		}
		if err := remote.WriteIndex(dst, idx, dstOpts...); err != nil {
			return name.Digest{}, fmt.Errorf("copying %s to %s: %w", src, dst, err)
		}
	} else {
		img, err := desc.Image()
		if err != nil {
			return name.Digest{}, err
		}
		if err := remote.Write(dst, img, dstOpts...); err != nil {
			return name.Digest{}, fmt.Errorf("copying %s to %s: %w", src, dst, err)
		}
	}
	got, err := remote.Head(dst, dstOpts...)
	if err != nil {
		return name.Digest{}, fmt.Errorf("checking %s: %w", dst, err)
	}
	if got.Digest != desc.Digest {
		return name.Digest{}, fmt.Errorf("%s holds %s after the copy, not %s", dst, got.Digest, desc.Digest)
	}
	if rec, ok := c.cache.lookupDigest(desc.Digest.String()); ok {
		rec.Registry, rec.Repository = dst.Context().RegistryStr(), dst.Context().RepositoryStr()
		c.cache.rememberBuild(rec)
	}
	pinned := dst.Context().Digest(desc.Digest.String())
	c.opts.logger.Info("copied", "from", src.String(), "to", pinned.String())
	return pinned, nil
}
