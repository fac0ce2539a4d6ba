package containerdisk

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/imagepipe/imagepipe/internal/need"
)

// zstdDiffLimit bounds the bytes each side decodes of one fuzz input:
// a few bytes of zstd can stand for gigabytes.
const zstdDiffLimit = 4 << 20

// FuzzZstdAgainstCDI feeds each input, as a zstd layer, to the gate's
// decoder and to CDI's: test/zstdref, built by `make tools` with the
// klauspost/compress version CDI's released importer links, reading the
// layer as that importer does (its 512-byte header probe included), once
// with the decoder's default concurrency and once with one goroutine.
//
// CDI must read every stream the gate could keep as the canonical layer
// exactly as the gate reads it. The gate keeps a pushed layer only when
// its compression framing is imagepipe's (LayerReader.OwnCompressionFraming)
// and its tar is imagepipe's; any other layer it reads, it rewrites, so
// CDI never reads those bytes and how it would read them does not matter.
// So CDI is asked about every stream the gate decodes in imagepipe's
// framing, whatever its tar: each of CDI's readings must decode it to the
// same bytes. The gate refusing a stream is safe too (nothing reaches a
// hub). Leaving the other streams out also spares the fuzzer CDI's slow
// decoding of ones such as windows of up to 512 MiB. Streams that decode
// to less than two tar blocks are skipped: the gate's tar check refuses
// those anyway.
func FuzzZstdAgainstCDI(f *testing.F) {
	ref := startZstdRef(f)
	f.Add(rawZstdFrame(bytes.Repeat([]byte("imagepipe"), 120)))
	disk := bytes.Repeat([]byte("a small disk "), 2048)
	rng := rand.New(rand.NewPCG(5, 6))
	for i := range 2048 {
		disk[4096+i] = byte(rng.Uint32())
	}
	layer, tarball := zstdLayer(f, disk)
	f.Add(layer)
	f.Add(compressedLead(f, layer, tarball))
	f.Fuzz(func(t *testing.T, layer []byte) {
		gate, own, err := gateReadZstd(layer)
		if err != nil || len(gate) < 1024 {
			return // refused by the gate: safe, whatever CDI makes of it
		}
		if !own {
			return // rewritten by the gate: CDI never reads these bytes
		}
		readings, err := ref.read(layer)
		if err != nil {
			t.Fatal(err)
		}
		want := byte(zstdRefRead)
		if len(gate) > zstdDiffLimit {
			gate, want = gate[:zstdDiffLimit], zstdRefOver
		}
		for i, r := range readings {
			if r.status != want || !bytes.Equal(r.out, gate) {
				t.Errorf("the gate decodes %d bytes in imagepipe's framing; CDI's reading %d (%s) gives status %d, %d bytes, first difference at %d, error %q",
					len(gate), i, zstdRefReadings[i], r.status, len(r.out), firstDifference(r.out, gate), r.msg)
			}
		}
	})
}

// zstdRefReadings name CDI's readings, in the order zstdref answers.
var zstdRefReadings = []string{"default concurrency", "concurrency 1"}

// zstdref's status bytes.
const (
	zstdRefRead    = 0
	zstdRefRefused = 1
	zstdRefOver    = 2
)

// gateReadZstd decodes layer as the gate reads a zstd layer
// (decompressLayer, then finish's check that nothing follows the
// compressed stream), up to zstdDiffLimit+1 bytes, and reports whether
// its compression framing is imagepipe's, as OwnCompressionFraming does
// once the layer is read to its end: the framing check sees every byte of
// such a layer, and the tar's size is what the stream decodes to. The
// framing of a stream past the limit is judged as one of limit+1 bytes:
// imagepipe's body frame header is the same for every tar past 1 MiB
// (zstdBodyHeader).
func gateReadZstd(layer []byte) (tarball []byte, own bool, err error) {
	buf := bufio.NewReaderSize(bytes.NewReader(layer), 128<<10)
	zr, err := decompressLayer(ocispec.MediaTypeImageLayerZstd, buf, nil)
	if err != nil {
		return nil, false, err
	}
	defer zr.Close()
	got, err := io.ReadAll(io.LimitReader(zr, zstdDiffLimit+1))
	if err != nil {
		return got, false, err
	}
	if len(got) <= zstdDiffLimit {
		if n, _ := io.Copy(io.Discard, buf); n > 0 {
			return got, false, fmt.Errorf("%d bytes follow the compressed stream", n)
		}
	}
	stream := newStreamFraming(ocispec.MediaTypeImageLayerZstd)
	stream.Write(layer)
	return got, stream.own(true, int64(len(got))), nil
}

func firstDifference(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// zstdRef is a running test/zstdref.
type zstdRef struct {
	mu  sync.Mutex
	in  io.WriteCloser
	out *bufio.Reader
}

// zstdRefReading is one of zstdref's answers.
type zstdRefReading struct {
	status byte
	out    []byte
	msg    string
}

// startZstdRef starts zstdref, checks that it links the klauspost/compress
// version test/zstdref/go.mod requires, and stops it when tb ends.
func startZstdRef(tb testing.TB) *zstdRef {
	tb.Helper()
	path := need.Built(tb, "zstdref")
	want := zstdRefVersion(tb)
	r := &zstdRef{}
	cmd := exec.Command(path, fmt.Sprint(zstdDiffLimit))
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatalf("starting %s: %v", path, err)
	}
	tb.Cleanup(func() {
		in.Close()
		if err := cmd.Wait(); err != nil {
			tb.Errorf("zstdref: %v", err)
		}
	})
	r.in, r.out = in, bufio.NewReaderSize(out, 1<<20)
	hello, err := r.out.ReadString('\n')
	if err != nil {
		tb.Fatalf("reading zstdref's first line: %v", err)
	}
	if got := strings.TrimSpace(hello); got != "zstdref klauspost/compress "+want {
		tb.Fatalf("%s says %q; test/zstdref/go.mod requires klauspost/compress %s: run make tools", path, got, want)
	}
	return r
}

// zstdRefVersion is the klauspost/compress version test/zstdref/go.mod
// requires: CDI's.
func zstdRefVersion(tb testing.TB) string {
	tb.Helper()
	mod, err := os.ReadFile(filepath.Join("..", "..", "test", "zstdref", "go.mod"))
	if err != nil {
		tb.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^require github\.com/klauspost/compress (v\S+)$`).FindSubmatch(mod)
	if m == nil {
		tb.Fatal("test/zstdref/go.mod requires no klauspost/compress version")
	}
	return string(m[1])
}

// read sends layer and returns zstdref's readings of it.
func (r *zstdRef) read(layer []byte) ([]zstdRefReading, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	req := binary.BigEndian.AppendUint32(nil, uint32(len(layer)))
	if _, err := r.in.Write(append(req, layer...)); err != nil {
		return nil, fmt.Errorf("writing to zstdref: %w", err)
	}
	readings := make([]zstdRefReading, len(zstdRefReadings))
	for i := range readings {
		var head [5]byte
		if _, err := io.ReadFull(r.out, head[:]); err != nil {
			return nil, r.broken(err)
		}
		readings[i].status = head[0]
		n := binary.BigEndian.Uint32(head[1:])
		if n > zstdDiffLimit {
			return nil, fmt.Errorf("zstdref answered %d bytes, over its limit", n)
		}
		readings[i].out = make([]byte, n)
		if _, err := io.ReadFull(r.out, readings[i].out); err != nil {
			return nil, r.broken(err)
		}
		var m [4]byte
		if _, err := io.ReadFull(r.out, m[:]); err != nil {
			return nil, r.broken(err)
		}
		n = binary.BigEndian.Uint32(m[:])
		if n > 1<<16 {
			return nil, fmt.Errorf("zstdref answered an error of %d bytes", n)
		}
		msg := make([]byte, n)
		if _, err := io.ReadFull(r.out, msg); err != nil {
			return nil, r.broken(err)
		}
		readings[i].msg = string(msg)
	}
	return readings, nil
}

func (r *zstdRef) broken(err error) error {
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("reading zstdref's answer: %w", err)
}
