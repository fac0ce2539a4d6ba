package containerdisk

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/imagepipe/imagepipe/internal/convert"
	"github.com/imagepipe/imagepipe/internal/reject"
)

// Options say how a disk is stored in its containerDisk. The zero value
// stores a qcow2 disk in a gzip-compressed layer.
type Options struct {
	// DiskFormat is the format of disk/disk.img: convert.FormatQCOW2
	// (default) or convert.FormatRaw.
	DiskFormat convert.Format
	// Compression of the layer; default gzip.
	Compression Compression
	// Logger receives the disk engine's debug messages; nil discards them.
	Logger *slog.Logger
}

// Description is what is known of a Disk before its data is read: what the
// image's annotations, its build key and the import's result record.
type Description struct {
	// DiskFormat is the format of disk/disk.img ("qcow2" or "raw").
	DiskFormat string
	// SourceFormat is the format the source image was found to have.
	SourceFormat string
	// VirtualSize is the guest-visible size in bytes.
	VirtualSize int64
	// Compression is the layer's compression.
	Compression Compression
}

// Disk is a validated disk image on its way into a containerDisk layer.
// Prepare walks its allocation map and plans the stored disk; WriteLayer
// then writes the layer, as often as asked (a lost upload sends it again).
// A Disk is not safe for concurrent use.
type Disk struct {
	img       *convert.Image
	opts      Options
	plan      *convert.Plan
	allocated int64
}

// NewDisk returns the containerDisk of img, stored as opts say.
func NewDisk(img *convert.Image, opts Options) (*Disk, error) {
	if opts.DiskFormat == "" {
		opts.DiskFormat = convert.FormatQCOW2
	}
	if opts.DiskFormat != convert.FormatQCOW2 && opts.DiskFormat != convert.FormatRaw {
		return nil, fmt.Errorf("unsupported disk format %q (qcow2 or raw)", opts.DiskFormat)
	}
	var err error
	if opts.Compression, err = ParseCompression(string(opts.Compression)); err != nil {
		return nil, err
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Disk{img: img, opts: opts}, nil
}

// Describe returns what is known of the disk without reading it.
func (d *Disk) Describe() Description {
	info := d.img.Info()
	return Description{
		DiskFormat:   string(d.opts.DiskFormat),
		SourceFormat: string(info.Format),
		VirtualSize:  info.VirtualSize,
		Compression:  d.opts.Compression,
	}
}

// Prepare walks the whole allocation map, so that an invalid table is
// refused before anything is written, and plans the stored disk. It
// returns the guest bytes the stored disk holds as data: for qcow2 the
// planned clusters (content-defined, so that digests do not depend on the
// file system the source sits on), for raw the source's allocation.
func (d *Disk) Prepare(ctx context.Context) (allocated int64, err error) {
	summary, err := d.img.Verify(ctx)
	if err != nil {
		return 0, err
	}
	plan, err := d.img.Plan(ctx, convert.Options{To: d.opts.DiskFormat, Logger: d.opts.Logger})
	if err != nil {
		return 0, err
	}
	d.plan, d.allocated = plan, summary.AllocatedBytes
	if n, ok := plan.DataBytes(); ok {
		d.allocated = n
	}
	return d.allocated, nil
}

// WriteLayer writes the compressed layer to w (see the package function
// WriteLayer), preparing the disk first if Prepare was not called.
// progress, when set, is called with the uncompressed layer bytes done and
// their total.
func (d *Disk) WriteLayer(ctx context.Context, w io.Writer, progress func(done, total int64)) (LayerInfo, error) {
	if d.plan == nil {
		if _, err := d.Prepare(ctx); err != nil {
			return LayerInfo{}, err
		}
	}
	var tee io.Writer
	if progress != nil {
		tee = &progressWriter{fn: progress, total: TarSize(d.plan.Size())}
	}
	return WriteLayer(ctx, w, d.plan, d.opts.Compression, tee)
}

// TarDigest returns the diff ID of the disk's layer (the sha256 of its
// tar), which does not depend on the compression, without compressing,
// and the size of the stored disk/disk.img: one pass over the disk,
// preparing it first if Prepare was not called.
func (d *Disk) TarDigest(ctx context.Context) (diffID string, diskSize int64, err error) {
	if d.plan == nil {
		if _, err := d.Prepare(ctx); err != nil {
			return "", 0, err
		}
	}
	info, err := WriteLayer(ctx, io.Discard, d.plan, CompressionNone, nil)
	return info.DiffID, d.plan.Size(), err
}

// SameAs reports whether the disk imagepipe writes (its planned
// disk/disk.img, not the tar) is byte for byte the size bytes of r: one
// pass that compares instead of hashing, and stops at the first byte that
// differs. It prepares the disk first if Prepare was not called.
func (d *Disk) SameAs(ctx context.Context, r io.ReaderAt, size int64) (bool, error) {
	if d.plan == nil {
		if _, err := d.Prepare(ctx); err != nil {
			return false, err
		}
	}
	if d.plan.Size() != size {
		return false, nil
	}
	err := d.plan.Write(ctx, &compareWriter{r: r, buf: make([]byte, 1<<20)})
	if errors.Is(err, errDiffers) {
		return false, nil
	}
	return err == nil, err
}

// errDiffers stops a compareWriter's writer at the first difference.
var errDiffers = errors.New("the bytes differ")

// compareWriter compares what is written to it with r from offset 0.
type compareWriter struct {
	r   io.ReaderAt
	off int64
	buf []byte
}

func (c *compareWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		k := min(len(p), len(c.buf))
		if _, err := c.r.ReadAt(c.buf[:k], c.off); err != nil {
			if errors.Is(err, io.EOF) {
				return 0, errDiffers
			}
			return 0, err
		}
		if !bytes.Equal(c.buf[:k], p[:k]) {
			return 0, errDiffers
		}
		c.off += int64(k)
		p = p[k:]
	}
	return n, nil
}

// CompressionOf is the compression a layer media type names: gzip, zstd
// or none (a tar), for OCI and Docker media types alike.
func CompressionOf(mediaType string) (Compression, error) {
	c, err := mediaTypeContent(mediaType)
	switch c {
	case contentGzip:
		return CompressionGzip, nil
	case contentZstd:
		return CompressionZstd, nil
	case contentTar:
		return CompressionNone, nil
	}
	return "", err
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

// Rejected reports whether err rejects a disk or a layer: a
// *reject.Error (a disk or a shape reason). Such an error is a verdict on
// the bytes, not a failure to move them.
func Rejected(err error) bool { return errors.Is(err, reject.ErrRejected) }
