package gate

import (
	"bytes"
	"crypto/sha256"
	"encoding"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/zstd"

	"github.com/imagepipe/imagepipe/internal/containerdisk"
)

// rleBlock is the largest zstd block, and so what one run-length block
// stands for: 4 bytes of layer (a 3-byte block header and the byte) for
// 128 KiB of disk.
const rleBlock = 128 << 10

// rleLayer is a zstd containerDisk layer whose disk/disk.img is a raw disk
// of one byte repeated, its last 128 KiB of another, written as run-length
// blocks: a few hundred KB of layer declare GiBs, and every byte of them
// must be decompressed, hashed and checked to be verified. The disk holds
// no zeros, so a verifier's spool has no holes to leave.
type rleLayer struct {
	blob     []byte
	digest   v1.Hash
	diffID   v1.Hash
	diskSize int64
}

var _ v1.Layer = (*rleLayer)(nil)

// newRLELayers makes one layer per byte in lasts: a raw disk of diskSize
// bytes (a multiple of 128 KiB) of fill, whose last 128 KiB are that byte.
// The layers differ only at their end, so the tar they share is hashed
// once (their diff IDs are the costly part: a GiB a second).
func newRLELayers(diskSize int64, fill byte, lasts []byte) ([]*rleLayer, error) {
	if diskSize < rleBlock || diskSize%rleBlock != 0 {
		return nil, fmt.Errorf("a run-length disk is whole 128 KiB blocks, not %d bytes", diskSize)
	}
	head, tail := containerdisk.TarFraming(diskSize)
	enc, err := zstd.NewWriter(nil)
	if err != nil {
		return nil, err
	}
	defer enc.Close()
	// The tar headers go first as one raw block, then the disk's
	// run-length blocks, then the tar's end. The framing is not
	// imagepipe's, so the gate writes a canonical layer of its own for
	// these layers, as it does for any other tool's.
	headFrame, tailFrame := rawFrame(head), enc.EncodeAll(tail, nil)

	shared := sha256.New()
	shared.Write(head)
	run := bytes.Repeat([]byte{fill}, 1<<20)
	for left := diskSize - rleBlock; left > 0; left -= int64(len(run)) {
		shared.Write(run[:min(int64(len(run)), left)])
	}
	state, err := shared.(encoding.BinaryMarshaler).MarshalBinary()
	if err != nil {
		return nil, err
	}

	var layers []*rleLayer
	for _, last := range lasts {
		h := sha256.New()
		if err := h.(encoding.BinaryUnmarshaler).UnmarshalBinary(state); err != nil {
			return nil, err
		}
		h.Write(bytes.Repeat([]byte{last}, rleBlock))
		h.Write(tail)
		blob := append(bytes.Clone(headFrame), rleFrame(diskSize, fill, last)...)
		blob = append(blob, tailFrame...)
		sum := sha256.Sum256(blob)
		layers = append(layers, &rleLayer{
			blob:     blob,
			digest:   v1.Hash{Algorithm: "sha256", Hex: fmt.Sprintf("%x", sum)},
			diffID:   v1.Hash{Algorithm: "sha256", Hex: fmt.Sprintf("%x", h.Sum(nil))},
			diskSize: diskSize,
		})
	}
	return layers, nil
}

// rawFrame is one zstd frame (RFC 8878) holding b (at most 128 KiB) as
// one raw block: a frame header without a content size and with a window
// of b's size rounded up, then the block.
func rawFrame(b []byte) []byte {
	frame := binary.LittleEndian.AppendUint32(nil, 0xFD2FB528)
	exp := 0
	for 1<<(10+exp) < len(b) {
		exp++
	}
	frame = append(frame, 0x00, byte(exp)<<3) // no size, no checksum; window 2^(10+exp)
	header := uint32(len(b))<<3 | 1           // a raw block, the frame's last
	frame = append(frame, byte(header), byte(header>>8), byte(header>>16))
	return append(frame, b...)
}

// rleFrame is one zstd frame (RFC 8878) of n bytes of fill, the last 128
// KiB of them last: a frame header without a content size and with a
// 128 KiB window, then one run-length block per 128 KiB.
func rleFrame(n int64, fill, last byte) []byte {
	frame := binary.LittleEndian.AppendUint32(nil, 0xFD2FB528)
	frame = append(frame, 0x00, (17-10)<<3) // no size, no checksum; window 2^17
	blocks := n / rleBlock
	frame = append(frame, make([]byte, 4*blocks)...)
	b := frame[len(frame)-int(4*blocks):]
	for i := range blocks {
		header := uint32(rleBlock)<<3 | 1<<1 // run-length block of 128 KiB
		value := fill
		if i == blocks-1 {
			header |= 1 // the frame's last block
			value = last
		}
		b[4*i], b[4*i+1], b[4*i+2], b[4*i+3] = byte(header), byte(header>>8), byte(header>>16), value
	}
	return frame
}

func (l *rleLayer) Digest() (v1.Hash, error) { return l.digest, nil }

func (l *rleLayer) DiffID() (v1.Hash, error) { return l.diffID, nil }

func (l *rleLayer) Compressed() (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(l.blob)), nil
}

func (l *rleLayer) Uncompressed() (io.ReadCloser, error) {
	zr, err := zstd.NewReader(bytes.NewReader(l.blob), zstd.WithDecoderConcurrency(1))
	if err != nil {
		return nil, err
	}
	return zr.IOReadCloser(), nil
}

func (l *rleLayer) Size() (int64, error) { return int64(len(l.blob)), nil }

func (l *rleLayer) MediaType() (types.MediaType, error) { return types.OCILayerZStd, nil }

// rleImage is an OCI image of the one layer for platform, with the
// manifest's annotations.
func rleImage(layer v1.Layer, platform v1.Platform, annotations map[string]string) (v1.Image, error) {
	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), layer)
	if err != nil {
		return nil, err
	}
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant = platform.OS, platform.Architecture, platform.Variant
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return nil, err
	}
	img, ok := mutate.Annotations(img, maps.Clone(annotations)).(v1.Image)
	if !ok {
		return nil, errors.New("annotating an image gave no image")
	}
	return img, nil
}

// indexPlatforms are the eight linux platforms of the bench's index.
var indexPlatforms = []v1.Platform{
	{OS: "linux", Architecture: "amd64"}, {OS: "linux", Architecture: "arm64"},
	{OS: "linux", Architecture: "arm", Variant: "v7"}, {OS: "linux", Architecture: "arm", Variant: "v6"},
	{OS: "linux", Architecture: "386"}, {OS: "linux", Architecture: "ppc64le"},
	{OS: "linux", Architecture: "s390x"}, {OS: "linux", Architecture: "riscv64"},
}

// rleIndex is an OCI index of one image per platform, each with a
// manifest and config of its own naming the one layer.
func rleIndex(layer v1.Layer, platforms []v1.Platform) (v1.ImageIndex, error) {
	var adds []mutate.IndexAddendum
	for _, p := range platforms {
		img, err := rleImage(layer, p, nil)
		if err != nil {
			return nil, err
		}
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &p}})
	}
	return mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), adds...), nil
}
