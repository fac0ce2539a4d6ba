package convert

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/imagepipe/imagepipe/internal/reject"
)

// DefaultMaxVirtualSize is the largest virtual disk size accepted unless
// OpenOptions.MaxVirtualSize says otherwise: 2 TiB.
const DefaultMaxVirtualSize = 2 << 40

// OpenOptions says how to open an untrusted image. The zero value detects
// the format and applies the default limits.
type OpenOptions struct {
	// Format is the format the caller declares. Empty means "detect".
	// When set, content of any other format is rejected rather than
	// reinterpreted.
	Format Format
	// AllowISO accepts an ISO 9660 image as raw.
	AllowISO bool
	// MaxVirtualSize caps the virtual size; 0 means DefaultMaxVirtualSize.
	MaxVirtualSize int64
}

// Info describes an opened image. Fields that do not apply to a format are
// zero.
type Info struct {
	// Format is the detected format (FormatRaw for an ISO opened as raw).
	Format Format
	// VirtualSize is the guest-visible disk size in bytes.
	VirtualSize int64
	// FileSize is the size of the image file in bytes.
	FileSize int64
	// ClusterSize is the qcow2 cluster size in bytes.
	ClusterSize int64
	// Version is the qcow2 version (2 or 3).
	Version int
	// Compat is the qcow2 compatibility level as qemu-img names it ("0.10" or "1.1").
	Compat string
	// CompressionType is the qcow2 compression type for compressed clusters ("zlib" or "zstd").
	CompressionType string
	// Snapshots is the number of internal snapshots, which are ignored.
	Snapshots int
	// Bitmaps reports a bitmaps extension, which is ignored.
	Bitmaps bool
	// Dirty reports the qcow2 dirty bit; refcounts are not used, so a
	// dirty image converts correctly.
	Dirty bool
}

// Image is a validated disk image opened for reading. It is safe for
// concurrent use.
type Image struct {
	info    Info
	src     source
	file    *os.File // the image file, when r is one: enables copy_file_range
	verdict verdict  // Verify's outcome, once known
}

// extentKind classifies a guest range.
type extentKind uint8

const (
	// extentZero reads as zeros: a hole, an unallocated or a zero cluster.
	extentZero extentKind = iota
	// extentData is stored uncompressed at a host offset.
	extentData
	// extentCompressed is one compressed qcow2 cluster.
	extentCompressed
)

// extent is a guest byte range and where its contents come from.
type extent struct {
	kind   extentKind
	guest  int64 // guest offset of the range
	length int64 // bytes of guest data
	host   int64 // extentData, extentCompressed: host file offset
	clen   int64 // extentCompressed: bytes of compressed data at host
}

// source is a format's view of the guest disk.
type source interface {
	// extents calls fn, in guest order, with extents that exactly cover
	// [off, off+n). Batches of a format's alignment() never split a
	// compressed extent.
	extents(ctx context.Context, off, n int64, fn func(extent) error) error
	// alignment is the guest granularity that keeps extents whole.
	alignment() int64
	// readExtent fills dst (len(dst) == e.length) with e's guest data.
	// scratch is per-goroutine state that may be reused between calls.
	readExtent(e extent, dst []byte, scratch *scratch) error
}

// Open detects and validates the image in r, which holds size bytes. It
// runs every check that needs only the header; Verify (which Plan and
// WriteFile run first) checks the L1/L2 tables and the clusters. The
// returned error is a *reject.Error when the image breaks the validation
// contract.
func Open(r io.ReaderAt, size int64, opts OpenOptions) (*Image, error) {
	maxVirtual := opts.MaxVirtualSize
	if maxVirtual <= 0 {
		maxVirtual = DefaultMaxVirtualSize
	}
	if size <= 0 {
		return nil, reject.New(reject.VirtualSize, "the image is empty")
	}
	det, err := Detect(r, size)
	if err != nil {
		return nil, err
	}
	if err := det.Check(opts.Format, opts.AllowISO); err != nil {
		return nil, err
	}
	img, err := openFormat(r, size, det.Format, maxVirtual)
	if err != nil {
		return nil, err
	}
	img.file, _ = r.(*os.File)
	return img, nil
}

func openFormat(r io.ReaderAt, size int64, format Format, maxVirtual int64) (*Image, error) {
	if format == FormatQCOW2 {
		return openQCOW2(r, size, maxVirtual)
	}
	// Raw, or ISO accepted as raw. Like QEMU, a raw disk is a whole number
	// of sectors: a partial last sector is padded with zeros.
	vsize := (size + 511) &^ 511
	if vsize > maxVirtual {
		return nil, reject.New(reject.VirtualSize, "the virtual size %d bytes exceeds the limit of %d bytes", vsize, maxVirtual)
	}
	return &Image{
		info: Info{Format: FormatRaw, VirtualSize: vsize, FileSize: size},
		src:  newRawSource(r, size),
	}, nil
}

func openQCOW2(r io.ReaderAt, size, maxVirtual int64) (*Image, error) {
	// The header and its extensions live in the first cluster, at most
	// 2 MiB. Read the 64 KiB every default image needs first, and the rest
	// of the cluster only when cluster_bits says it is larger.
	head, err := readHead(r, min(size, ProbeSize))
	if err != nil {
		return nil, err
	}
	if len(head) >= 24 {
		if bits := int64(head[23]); bits >= 17 && bits <= maxClusterBits && head[20]|head[21]|head[22] == 0 {
			if head, err = readHead(r, min(size, 1<<bits)); err != nil {
				return nil, err
			}
		}
	}
	h, err := parseQCOW2Header(head, size, maxVirtual)
	if err != nil {
		return nil, err
	}
	src, err := newQCOW2Source(r, size, h)
	if err != nil {
		return nil, err
	}
	compat := "1.1"
	if h.version == 2 {
		compat = "0.10"
	}
	return &Image{
		info: Info{
			Format:          FormatQCOW2,
			VirtualSize:     int64(h.size),
			FileSize:        size,
			ClusterSize:     h.clusterSize(),
			Version:         int(h.version),
			Compat:          compat,
			CompressionType: h.compressionName(),
			Snapshots:       int(h.nbSnapshots),
			Bitmaps:         h.hasBitmaps,
			Dirty:           h.incompatible&incompatDirty != 0,
		},
		src: src,
	}, nil
}

func readHead(r io.ReaderAt, n int64) ([]byte, error) {
	head := make([]byte, n)
	got, err := r.ReadAt(head, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("reading the image header: %w", err)
	}
	return head[:got], nil
}

// Info returns what the header says about the image.
func (img *Image) Info() Info { return img.info }

// MapSummary is the result of walking an image's allocation map.
type MapSummary struct {
	// AllocatedBytes is the guest bytes backed by stored data (what
	// qemu-img map reports as data), compressed clusters included.
	AllocatedBytes int64
	// CompressedClusters counts compressed qcow2 clusters.
	CompressedClusters int64
}

// readFull reads len(p) bytes at off; bytes past the end of the file read as
// zeros, as QEMU's file driver does.
func readFull(r io.ReaderAt, p []byte, off int64) error {
	n, err := r.ReadAt(p, off)
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("reading %d bytes at %d: %w", len(p), off, err)
	}
	clear(p[n:])
	return nil
}
