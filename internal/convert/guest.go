package convert

import (
	"context"
	"errors"
	"io"
)

// Guest returns a reader of the guest disk: the bytes a VM booted from img
// reads, zeros for holes, for looking inside an image (its partitions and
// files). It runs Verify first, once per Image, and returns its rejection:
// only a verified image's tables are followed. Each ReadAt reads only the
// guest range asked for (a compressed cluster is decompressed whole), and
// is safe for concurrent use.
func (img *Image) Guest(ctx context.Context) (io.ReaderAt, error) {
	if _, err := img.Verify(ctx); err != nil {
		return nil, err
	}
	return &guestReader{ctx: ctx, img: img}, nil
}

type guestReader struct {
	ctx context.Context
	img *Image
}

func (g *guestReader) ReadAt(p []byte, off int64) (int, error) {
	size := g.img.info.VirtualSize
	if off < 0 {
		return 0, errors.New("convert: negative guest offset")
	}
	if off >= size {
		return 0, io.EOF
	}
	n := min(int64(len(p)), size-off)
	var sc scratch
	defer sc.close()
	err := g.img.src.extents(g.ctx, off, n, func(e extent) error {
		return g.img.src.readExtent(e, p[e.guest-off:e.guest-off+e.length], &sc)
	})
	if err != nil {
		return 0, err
	}
	if n < int64(len(p)) {
		return int(n), io.EOF
	}
	return int(n), nil
}
