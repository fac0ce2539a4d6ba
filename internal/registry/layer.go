package registry

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"fmt"
	"hash"
	"io"
	"time"

	"github.com/klauspost/compress/zstd"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/imagepipe/imagepipe/internal/convert"
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

// ParseCompression validates a user's --compression value.
func ParseCompression(s string) (Compression, error) {
	switch c := Compression(s); c {
	case CompressionGzip, CompressionZstd, CompressionNone:
		return c, nil
	case "":
		return CompressionGzip, nil
	}
	return "", fmt.Errorf("unknown compression %q (gzip, zstd or none)", s)
}

func (c Compression) mediaType() string {
	switch c {
	case CompressionZstd:
		return ocispec.MediaTypeImageLayerZstd
	case CompressionNone:
		return ocispec.MediaTypeImageLayer
	}
	return ocispec.MediaTypeImageLayerGzip
}

// tarEpoch is the modification time of every tar entry, so that the same
// disk always gives the same layer bytes.
var tarEpoch = time.Unix(0, 0).UTC()

// writeDiskTar writes the containerDisk tar: the directory disk/ (0555)
// and the file disk/disk.img (0444) holding the planned disk, both owned by
// 107:107. The planned size goes into the file's header before its first
// byte, which is why the disk engine fixes sizes before writing.
func writeDiskTar(ctx context.Context, w io.Writer, plan *convert.Plan) error {
	tw := tar.NewWriter(w)
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
	file := &tar.Header{
		Typeflag: tar.TypeReg,
		Name:     api.DiskPath,
		Mode:     0o444,
		Uid:      api.DiskUID,
		Gid:      api.DiskGID,
		Size:     plan.Size(),
		ModTime:  tarEpoch,
	}
	if err := tw.WriteHeader(file); err != nil {
		return err
	}
	if err := plan.Write(ctx, tw); err != nil {
		return err
	}
	return tw.Close()
}

// layerInfo describes a built layer.
type layerInfo struct {
	diffID string // sha256 of the uncompressed tar
	digest string // sha256 of the blob as stored
	size   int64  // blob size in bytes
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

// buildLayer streams the compressed containerDisk layer into sink and
// returns its digests; tee, when not nil, also sees the uncompressed tar.
// Compression is deterministic: pgzip and zstd give the same bytes for the
// same input whatever the concurrency.
func buildLayer(ctx context.Context, plan *convert.Plan, comp Compression, sink, tee io.Writer) (layerInfo, error) {
	blob := newCountingHash()
	out := io.MultiWriter(sink, blob)
	var zw io.WriteCloser
	switch comp {
	case CompressionGzip:
		gz, err := newGzipWriter(out)
		if err != nil {
			return layerInfo{}, err
		}
		zw = gz
	case CompressionZstd:
		zs, err := zstd.NewWriter(out, zstd.WithEncoderLevel(zstd.SpeedFastest))
		if err != nil {
			return layerInfo{}, err
		}
		zw = zs
	default:
		zw = nopWriteCloser{out}
	}
	diff := newCountingHash()
	tarOut := io.MultiWriter(zw, diff)
	if tee != nil {
		tarOut = io.MultiWriter(zw, diff, tee)
	}
	if err := writeDiskTar(ctx, tarOut, plan); err != nil {
		zw.Close()
		return layerInfo{}, err
	}
	if err := zw.Close(); err != nil {
		return layerInfo{}, fmt.Errorf("compressing the layer: %w", err)
	}
	return layerInfo{diffID: diff.digest(), digest: blob.digest(), size: blob.n}, nil
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }
