package containerdisk

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"hash"
	"io"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/imagepipe/imagepipe/pkg/api"
)

// Compression is how the containerDisk layer is compressed.
type Compression string

// Layer compressions. Gzip is the default: every runtime and CDI read it.
const (
	CompressionGzip Compression = "gzip"
	CompressionZstd Compression = "zstd"
	CompressionNone Compression = "none"
)

// ParseCompression validates a user's --compression value; "" means gzip.
func ParseCompression(s string) (Compression, error) {
	switch c := Compression(s); c {
	case CompressionGzip, CompressionZstd, CompressionNone:
		return c, nil
	case "":
		return CompressionGzip, nil
	}
	return "", fmt.Errorf("unknown compression %q (gzip, zstd or none)", s)
}

// MediaType is the OCI media type of a layer with this compression.
func (c Compression) MediaType() string {
	switch c {
	case CompressionZstd:
		return ocispec.MediaTypeImageLayerZstd
	case CompressionNone:
		return ocispec.MediaTypeImageLayer
	}
	return ocispec.MediaTypeImageLayerGzip
}

// Compressor names the implementation that decides the compressed bytes:
// for gzip the compressor this binary was built with (GzipImplementation)
// and the padding of small layers, for zstd its layout, "" otherwise. Two
// builds with different compressors give different layers for the same
// disk.
func (c Compression) Compressor() string {
	switch c {
	case CompressionGzip:
		return GzipImplementation + "+" + gzipPadding
	case CompressionZstd:
		return zstdEncoding
	}
	return ""
}

// Payload is the content of disk/disk.img, whose size is fixed before its
// first byte is written (the tar header comes first). *convert.Plan is one.
type Payload interface {
	// Size is the exact number of bytes Write produces.
	Size() int64
	// Write writes the content to w in one sequential pass.
	Write(ctx context.Context, w io.Writer) error
}

// LayerInfo describes a built layer.
type LayerInfo struct {
	// DiffID is the sha256 of the uncompressed tar ("sha256:<hex>").
	DiffID string
	// Digest is the sha256 of the blob as stored.
	Digest string
	// Size is the blob's size in bytes.
	Size int64
}

// TarSize is the size of the uncompressed layer holding a disk of n bytes:
// two headers, the disk, its padding and the end-of-archive blocks. The
// end may be larger by the tar writer's padding; progress reports use it
// as their total.
func TarSize(n int64) int64 { return n + 3*512 }

// tarEpoch is the modification time of every tar entry, so that the same
// disk always gives the same layer bytes.
var tarEpoch = time.Unix(0, 0).UTC()

// writeDiskTar writes the containerDisk tar: the directory disk/ (0555)
// and the file disk/disk.img (0444) holding the disk, both owned by
// 107:107. The disk's size goes into the file's header before its first
// byte, which is why the disk engine fixes sizes before writing.
func writeDiskTar(ctx context.Context, w io.Writer, disk Payload) error {
	tw := tar.NewWriter(w)
	if err := writeDiskHeaders(tw, disk.Size()); err != nil {
		return err
	}
	if err := disk.Write(ctx, tw); err != nil {
		return err
	}
	return tw.Close()
}

// writeDiskHeaders writes the headers of disk/ and of disk/disk.img of
// size n.
func writeDiskHeaders(tw *tar.Writer, n int64) error {
	dir := &tar.Header{
		Typeflag: tar.TypeDir,
		Name:     api.DiskDir,
		Mode:     0o555,
		Uid:      api.DiskUID,
		Gid:      api.DiskGID,
		ModTime:  tarEpoch,
	}
	if err := tw.WriteHeader(dir); err != nil {
		return err
	}
	return tw.WriteHeader(&tar.Header{
		Typeflag: tar.TypeReg,
		Name:     api.DiskPath,
		Mode:     0o444,
		Uid:      api.DiskUID,
		Gid:      api.DiskGID,
		Size:     n,
		ModTime:  tarEpoch,
	})
}

// TarFraming is what imagepipe's tar holds around a disk of n bytes: the
// bytes before the disk's first byte, and after its last (padding to a
// whole block, then the two zero blocks that end an archive). The tar is
// head, the disk, tail.
func TarFraming(n int64) (head, tail []byte) {
	var b bytes.Buffer
	if err := writeDiskHeaders(tar.NewWriter(&b), n); err != nil {
		panic(err) // fixed headers: only a negative size fails
	}
	return b.Bytes(), make([]byte, (512-n%512)%512+1024)
}

// countingHash hashes and counts what passes through it.
type countingHash struct {
	h hash.Hash
	n int64
}

func newCountingHash() *countingHash { return &countingHash{h: sha256.New()} }

func (c *countingHash) Write(p []byte) (int, error) {
	c.h.Write(p)
	c.n += int64(len(p))
	return len(p), nil
}

func (c *countingHash) digest() string { return fmt.Sprintf("sha256:%x", c.h.Sum(nil)) }

// WriteLayer streams the compressed containerDisk layer holding disk into
// sink and returns its digests; tee, when not nil, also sees the
// uncompressed tar. The layer is deterministic: the same disk and
// compression give the same bytes whatever the concurrency and write
// sizes (fixed tar headers, no timestamps, block-parallel compressors).
// No layer is shorter than the 512 bytes CDI's importer reads before it
// knows the format: a gzip layer that would be is padded in its header
// (gzipPadder), which leaves the tar and so the diff ID unchanged.
func WriteLayer(ctx context.Context, sink io.Writer, disk Payload, comp Compression, tee io.Writer) (LayerInfo, error) {
	blob := newCountingHash()
	out := io.MultiWriter(sink, blob)
	zw, err := compressor(out, comp)
	if err != nil {
		return LayerInfo{}, err
	}
	diff := newCountingHash()
	tarOut := io.MultiWriter(zw, diff)
	if tee != nil {
		tarOut = io.MultiWriter(zw, diff, tee)
	}
	if err := writeDiskTar(ctx, tarOut, disk); err != nil {
		zw.Close()
		return LayerInfo{}, err
	}
	if err := zw.Close(); err != nil {
		return LayerInfo{}, fmt.Errorf("compressing the layer: %w", err)
	}
	return LayerInfo{DiffID: diff.digest(), Digest: blob.digest(), Size: blob.n}, nil
}

// compressor returns the writer that compresses into out.
func compressor(out io.Writer, comp Compression) (io.WriteCloser, error) {
	switch comp {
	case CompressionGzip:
		pad := newGzipPadder(out)
		zw, err := newGzipWriter(pad)
		if err != nil {
			return nil, err
		}
		return paddedGzip{Writer: zw, zw: zw, pad: pad}, nil
	case CompressionZstd:
		// The lead frame alone is over 1 KiB: no zstd layer is shorter
		// than CDI's peek (cdiPeekSize), nor is an uncompressed one (the
		// tar is at least 2 KiB).
		return newZstdWriter(out), nil
	}
	return nopWriteCloser{out}, nil
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }
