package containerdisk

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"os/exec"
	"testing"

	"github.com/klauspost/compress/zstd"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/imagepipe/imagepipe/internal/need"
)

// bytesPayload is a disk held in memory.
type bytesPayload []byte

func (b bytesPayload) Size() int64 { return int64(len(b)) }
func (b bytesPayload) Write(_ context.Context, w io.Writer) error {
	_, err := w.Write(b)
	return err
}

// disks are contents whose zstd streams differ in shape: all zeros (tiny
// first blocks), incompressible, and mixed.
func testDisks() map[string][]byte {
	rng := rand.New(rand.NewPCG(1, 2))
	random := make([]byte, 3<<20)
	for i := range random {
		random[i] = byte(rng.Uint32())
	}
	mixed := bytes.Repeat([]byte("qcow2-ish header and zeros "), 40000)
	copy(mixed[100000:], random[:500000])
	return map[string][]byte{"zeros": make([]byte, 4<<20), "random": random, "mixed": mixed}
}

// zstdLayer builds the zstd layer of disk and returns it with its tar.
func zstdLayer(t testing.TB, disk []byte) (layer, tarball []byte) {
	t.Helper()
	var out, tee bytes.Buffer
	if _, err := WriteLayer(t.Context(), &out, bytesPayload(disk), CompressionZstd, &tee); err != nil {
		t.Fatal(err)
	}
	return out.Bytes(), tee.Bytes()
}

// probeLikeCDI reads a zstd layer the way CDI's importer up to v1.66
// does (kubevirt/containerized-data-importer#4277): the first 512
// compressed bytes into a buffer, a zstd decoder over that buffer and the
// rest, the first 512 decompressed bytes into the same buffer, then the
// rest of the stream.
func probeLikeCDI(layer []byte) ([]byte, error) {
	src := bytes.NewReader(layer)
	buf := make([]byte, 512)
	if _, err := io.ReadFull(src, buf); err != nil {
		return nil, err
	}
	// One goroutine: the decoder reads its input only inside Read, so the
	// overwrite below happens at a defined point (and the race detector
	// sees no race in the model itself).
	dec, err := zstd.NewReader(io.MultiReader(bytes.NewReader(buf), src), zstd.WithDecoderConcurrency(1))
	if err != nil {
		return nil, err
	}
	defer dec.Close()
	if _, err := io.ReadFull(dec, buf); err != nil { // overwrites the compressed bytes
		return nil, err
	}
	rest, err := io.ReadAll(dec)
	return append(append([]byte(nil), buf...), rest...), err
}

func TestZstdLayerSurvivesCDIsHeaderProbe(t *testing.T) {
	for name, disk := range testDisks() {
		t.Run(name, func(t *testing.T) {
			layer, tarball := zstdLayer(t, disk)
			got, err := probeLikeCDI(layer)
			if err != nil || !bytes.Equal(got, tarball) {
				t.Fatalf("read as CDI reads it: %d bytes, %v; want the %d-byte tar", len(got), err, len(tarball))
			}
			// The probe is not a tautology: a plain zstd stream of the same
			// tar, whose first block ends early, breaks under it.
			var plain bytes.Buffer
			enc, _ := zstd.NewWriter(&plain, zstd.WithEncoderLevel(zstd.SpeedFastest))
			enc.Write(tarball)
			enc.Close()
			if got, err := probeLikeCDI(plain.Bytes()); err == nil && bytes.Equal(got, tarball) && name == "zeros" {
				t.Errorf("a plain zstd stream of zeros survived the probe; the probe does not model the bug")
			}
		})
	}
}

// TestZstdLayerReadByTheZstdTool decodes the layer with the reference zstd
// implementation, an independent reader of concatenated frames.
func TestZstdLayerReadByTheZstdTool(t *testing.T) {
	need.Program(t, "zstd")
	layer, tarball := zstdLayer(t, testDisks()["mixed"])
	cmd := exec.Command("zstd", "-d", "-c")
	cmd.Stdin = bytes.NewReader(layer)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	got, err := cmd.Output()
	if err != nil || !bytes.Equal(got, tarball) {
		t.Fatalf("zstd -d: %d bytes, %v %s; want the %d-byte tar", len(got), err, stderr.String(), len(tarball))
	}
}

func TestRawZstdFrame(t *testing.T) {
	for _, n := range []int{0, 1, 255, 256, 1024} {
		data := bytes.Repeat([]byte{0xa5}, n)
		dec, err := zstd.NewReader(bytes.NewReader(rawZstdFrame(data)))
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(dec)
		dec.Close()
		if err != nil && !errors.Is(err, io.EOF) || !bytes.Equal(got, data) {
			t.Errorf("%d bytes: decoded %d, %v", n, len(got), err)
		}
	}
}

// TestZstdLayerWhoseFirstBlockEndsEarlyIsReadNotKept: a zstd layer whose
// first block ends before byte 512 is one CDI's header probe breaks (it
// decodes bytes it has already overwritten). The gate reads it, as any
// zstd reader does, and does not take its framing for imagepipe's, so it
// never stands as a canonical layer; imagepipe's own layer of the same tar
// is read too, in imagepipe's framing.
func TestZstdLayerWhoseFirstBlockEndsEarlyIsReadNotKept(t *testing.T) {
	layer, tarball := zstdLayer(t, testDisks()["zeros"])
	var small bytes.Buffer
	enc, _ := zstd.NewWriter(&small, zstd.WithWindowSize(1<<10))
	enc.Write(tarball)
	enc.Close()
	if got, err := probeLikeCDI(small.Bytes()); err == nil && bytes.Equal(got, tarball) {
		t.Fatal("CDI's probe reads the layer of small blocks; the case tests nothing")
	}
	for name, c := range map[string]struct {
		blob []byte
		own  bool
	}{"small blocks": {small.Bytes(), false}, "imagepipe's": {layer, true}} {
		atOpen, atEnd, err := ownFraming(t, ocispec.MediaTypeImageLayerZstd, c.blob)
		if err != nil || atOpen != c.own || atEnd != c.own {
			t.Errorf("%s: own framing %v after opening, %v at the end (%v); want %v and the layer read", name, atOpen, atEnd, err, c.own)
		}
	}
}
