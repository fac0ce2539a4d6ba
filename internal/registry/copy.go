package registry

import (
	"context"
	"fmt"
	"slices"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// CopyOptions say what Copy copies. The zero value copies whatever src
// names, an image index with every image it lists.
type CopyOptions struct {
	// Platform, when set, copies only src's image for that platform: from
	// an index, its one image for it (as PlatformImage resolves it:
	// none, several, or one whose config names another platform are
	// reject.PlatformMismatch); an image outside an index must be built
	// for it. dst then holds that image, not an index.
	Platform *Platform
	// Progress, when set, is called as blobs are copied, with the bytes
	// of the blobs (and manifests) dst has so far and the bytes of those
	// the copy has reached, as go-containerregistry counts them: the total
	// grows as the copy finds more to send, and blobs dst already holds
	// count as done at once. It is called from one goroutine at a time.
	Progress func(done, total int64)
}

// Copy copies the image (or image index, within MaxIndexSize and
// MaxIndexEntries) at src to dst, which may be on another registry, and
// returns dst pinned by digest. The manifest is
// copied byte for byte, so the digest stays the same; blobs dst already
// holds are skipped, and on the same registry they are mounted from src's
// repository instead of sent.
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
		if err := opts.Platform.validate(); err != nil {
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
	if err := c.write(src, dst, desc, opts.Progress, dstOpts); err != nil {
		return name.Digest{}, err
	}
	got, err := remote.Head(dst, dstOpts...)
	if err != nil {
		return name.Digest{}, fmt.Errorf("checking %s: %w", dst, err)
	}
	if got.Digest != desc.Digest {
		return name.Digest{}, fmt.Errorf("%s holds %s after the copy, not %s", dst, got.Digest, desc.Digest)
	}
	pinned := dst.Context().Digest(desc.Digest.String())
	c.opts.logger.Info("copied", "from", src.String(), "to", pinned.String())
	return pinned, nil
}

// write writes the image or index desc describes to dst, reporting to
// progress (when not nil) as go-containerregistry sends.
func (c *Client) write(src, dst name.Reference, desc *remote.Descriptor, progress func(done, total int64), dstOpts []remote.Option) error {
	var push func(opts ...remote.Option) error
	if desc.MediaType.IsIndex() {
		if _, err := parseIndex(desc.Manifest); err != nil {
			return fmt.Errorf("copying %s: %w", src, err)
		}
		idx, err := desc.ImageIndex()
		if err != nil {
			return err
		}
		push = func(opts ...remote.Option) error { return remote.WriteIndex(dst, idx, opts...) }
	} else {
		img, err := desc.Image()
		if err != nil {
			return err
		}
		push = func(opts ...remote.Option) error { return remote.Write(dst, img, opts...) }
	}
	stop := func(bool) {}
	if progress != nil {
		stop = reportUpdates(progress, &dstOpts)
	}
	err := push(dstOpts...)
	stop(err == nil)
	if err != nil {
		return fmt.Errorf("copying %s to %s: %w", src, dst, err)
	}
	return nil
}

// reportUpdates adds remote.WithProgress to *opts and passes its updates
// to progress from a goroutine of its own, until stop, called once the
// write has returned, has passed the last of them. go-containerregistry's
// count of bytes done may end short of its total (a blob can be sent in
// fewer bytes than its size counts), so stop(true), after a write that
// succeeded, reports the total as done.
func reportUpdates(progress func(done, total int64), opts *[]remote.Option) (stop func(ok bool)) {
	updates := make(chan v1.Update, 64)
	*opts = append(slices.Clip(*opts), remote.WithProgress(updates))
	quit, done := make(chan struct{}), make(chan struct{})
	var last v1.Update // written by the goroutine, read after done
	report := func(u v1.Update) {
		if u.Error == nil {
			last = u
			progress(u.Complete, u.Total)
		}
	}
	go func() {
		defer close(done)
		for {
			select {
			case u, ok := <-updates:
				if !ok {
					return
				}
				report(u)
			case <-quit:
				// The write has returned, so every update was sent (a
				// write may return without closing updates, when its
				// options fail): pass on those still buffered.
				for {
					select {
					case u, ok := <-updates:
						if !ok {
							return
						}
						report(u)
					default:
						return
					}
				}
			}
		}
	}()
	return func(ok bool) {
		close(quit)
		<-done
		if ok && last.Total > 0 && last.Complete != last.Total {
			progress(last.Total, last.Total)
		}
	}
}
