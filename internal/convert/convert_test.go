package convert

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"github.com/ulikunitz/xz"
	"golang.org/x/sys/unix"

	"github.com/imagepipe/imagepipe/internal/reject"
)

// sparseRaw returns a raw disk of size bytes with random data in a few
// places and zeros elsewhere.
func sparseRaw(size int64, at ...int64) []byte {
	b := make([]byte, size)
	rng := rand.New(rand.NewPCG(uint64(size), 1))
	for _, off := range at {
		for i := off; i < min(off+3000, size); i++ {
			b[i] = byte(rng.Uint32() | 1)
		}
	}
	return b
}

// convertBytes runs Open, Plan and Write on in-memory bytes.
func convertBytes(t *testing.T, in []byte, opts Options) []byte {
	t.Helper()
	img, err := Open(bytes.NewReader(in), int64(len(in)), OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := img.Plan(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := p.Write(t.Context(), &out); err != nil {
		t.Fatal(err)
	}
	if int64(out.Len()) != p.Size() {
		t.Fatalf("wrote %d bytes, planned %d", out.Len(), p.Size())
	}
	return out.Bytes()
}

// TestRoundTrip converts raw → qcow2 with our writer, reads the result back
// with our reader and expects the original bytes, for every cluster size.
// (test/oracle checks the same against qemu-img.)
func TestRoundTrip(t *testing.T) {
	raw := sparseRaw(9<<20+512, 0, 65530, 1<<20, 3<<20+7, 9<<20-100)
	for _, cs := range []int64{512, 4096, 64 << 10, 2 << 20} {
		q := convertBytes(t, raw, Options{ClusterSize: cs})
		back := convertBytes(t, q, Options{To: FormatRaw})
		if !bytes.Equal(back, raw) {
			t.Fatalf("cluster size %d: round trip changed the data", cs)
		}
		// Sparse: only clusters touched by the five 3000-byte runs hold data.
		img, err := Open(bytes.NewReader(q), int64(len(q)), OpenOptions{})
		if err != nil {
			t.Fatal(err)
		}
		sum, err := img.Verify(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if max := 5 * (3000/cs + 2) * cs; sum.AllocatedBytes > max {
			t.Errorf("cluster size %d: %d bytes allocated, want at most %d", cs, sum.AllocatedBytes, max)
		}
	}
}

// TestLayoutManyRefcountBlocks forces several refcount blocks and L2 tables,
// where the layout's fixed point matters.
func TestLayoutManyRefcountBlocks(t *testing.T) {
	const cs = 512 // 256 refcounts per block, 64 entries per L2 table
	var at []int64
	for off := int64(0); off < 4<<20; off += 9000 {
		at = append(at, off)
	}
	raw := sparseRaw(4<<20, at...)
	q := convertBytes(t, raw, Options{ClusterSize: cs})
	back := convertBytes(t, q, Options{To: FormatRaw})
	if !bytes.Equal(back, raw) {
		t.Fatal("round trip changed the data")
	}
	if int64(len(q))/cs < 256*3 {
		t.Fatalf("test image too small to need several refcount blocks: %d clusters", len(q)/cs)
	}
}

// TestRawOutputToFileIsSparse checks that raw output to a file leaves holes
// and reads back identical.
func TestRawOutputToFileIsSparse(t *testing.T) {
	raw := sparseRaw(64<<20, 0, 40<<20)
	p := rawPlan(t, raw)
	f, err := os.Create(filepath.Join(t.TempDir(), "out.raw"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := p.Write(t.Context(), f); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, raw) {
		t.Fatal("file contents differ from the input")
	}
	if used := diskUsage(t, f); used > 1<<20 {
		t.Errorf("64 MiB output with 6 KB of data uses %d bytes on disk; holes were written", used)
	}
}

// TestSparseRawInputSkipsHoles checks that SEEK_DATA/SEEK_HOLE is used: a
// raw file whose holes are not readable as zeros would be caught.
func TestSparseRawInputSkipsHoles(t *testing.T) {
	path := filepath.Join(t.TempDir(), "in.raw")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(1 << 30); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(bytes.Repeat([]byte{7}, 8192), 512<<20); err != nil {
		t.Fatal(err)
	}
	counting := &countingReaderAt{File: f}
	img, err := Open(counting, 1<<30, OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sum, err := img.Verify(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if sum.AllocatedBytes > 1<<20 {
		t.Errorf("allocated %d bytes; holes were not detected", sum.AllocatedBytes)
	}
	p, err := img.Plan(t.Context(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Write(t.Context(), io.Discard); err != nil {
		t.Fatal(err)
	}
	if counting.read > 4<<20 {
		t.Errorf("read %d bytes of a 1 GiB file with 8 KiB of data", counting.read)
	}
}

// countingReaderAt is an *os.File (so holes can be queried) that counts reads.
type countingReaderAt struct {
	*os.File
	read int64
}

func (c *countingReaderAt) ReadAt(p []byte, off int64) (int, error) {
	n, err := c.File.ReadAt(p, off)
	c.read += int64(n)
	return n, err
}

func TestSpoolStopsAtLimit(t *testing.T) {
	enc, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	bomb := enc.EncodeAll(make([]byte, 64<<20), nil) // 64 MiB of zeros in a few KiB
	r, w, err := Unwrap(bytes.NewReader(bomb))
	if err != nil || w != WrapperZstd {
		t.Fatalf("Unwrap = %v, %v", w, err)
	}
	defer r.Close()
	f, err := os.Create(filepath.Join(t.TempDir(), "spool"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	_, err = Spool(t.Context(), r, f, 8<<20)
	if re := reject.As(err); re == nil || re.Reason != reject.Wrapper {
		t.Fatalf("Spool over the limit: %v, want a %s rejection", err, reject.Wrapper)
	}
}

func TestUnwrapRefusesNestedWrappers(t *testing.T) {
	enc, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	inner := enc.EncodeAll([]byte("QFI\xfb"), nil)
	outer := enc.EncodeAll(inner, nil)
	_, _, err = Unwrap(bytes.NewReader(outer))
	if re := reject.As(err); re == nil || re.Reason != reject.Wrapper {
		t.Fatalf("nested zstd: %v, want a %s rejection", err, reject.Wrapper)
	}
}

func TestWriteStopsWhenCancelled(t *testing.T) {
	raw := sparseRaw(32<<20, 0, 16<<20)
	p := rawPlan(t, raw)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := p.Write(ctx, io.Discard); !errors.Is(err, context.Canceled) {
		t.Fatalf("Write after cancel = %v, want context.Canceled", err)
	}
}

func TestOptionsValidation(t *testing.T) {
	img, err := Open(bytes.NewReader(make([]byte, 4096)), 4096, OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []Options{{To: "vmdk"}, {ClusterSize: 1000}, {ClusterSize: 4 << 20}, {ClusterSize: 256}} {
		if _, err := img.Plan(t.Context(), o); err == nil {
			t.Errorf("Plan(%+v) accepted invalid options", o)
		}
	}
}

// diskUsage is the space a file occupies on disk, holes excluded.
func diskUsage(t *testing.T, f *os.File) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// TestWriteFileMatchesStream checks the one-pass file conversion against
// the streamed one: both read back to the same disk, and the file is no
// larger.
func TestWriteFileMatchesStream(t *testing.T) {
	raw := sparseRaw(9<<20+512, 0, 65530, 1<<20, 3<<20+7, 9<<20-100)
	for _, cs := range []int64{512, 64 << 10, 2 << 20} {
		streamed := convertBytes(t, raw, Options{ClusterSize: cs})
		img, err := Open(bytes.NewReader(raw), int64(len(raw)), OpenOptions{})
		if err != nil {
			t.Fatal(err)
		}
		f, err := os.Create(filepath.Join(t.TempDir(), "out.qcow2"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		size, err := img.WriteFile(t.Context(), f, Options{ClusterSize: cs})
		if err != nil {
			t.Fatal(err)
		}
		file, err := os.ReadFile(f.Name())
		if err != nil {
			t.Fatal(err)
		}
		if int64(len(file)) != size || size != int64(len(streamed)) {
			t.Errorf("cluster %d: file %d bytes (said %d), stream %d", cs, len(file), size, len(streamed))
		}
		if back := convertBytes(t, file, Options{To: FormatRaw}); !bytes.Equal(back, raw) {
			t.Errorf("cluster %d: the one-pass file reads back differently", cs)
		}
	}
}

// rawPlan opens an in-memory image and plans its conversion to raw.
func rawPlan(t *testing.T, raw []byte) *Plan {
	t.Helper()
	img, err := Open(bytes.NewReader(raw), int64(len(raw)), OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := img.Plan(t.Context(), Options{To: FormatRaw})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestDataBytesDependsOnContentOnly: the qcow2 plan's data bytes count the
// non-zero clusters, the last one clipped to the virtual size, whether the
// source's zeros are holes in a sparse file or written out.
func TestDataBytesDependsOnContentOnly(t *testing.T) {
	const size = 3<<20 + 1000 // the last cluster is partial
	content := sparseRaw(size, 0, 1<<20+70000, size-500)
	dir := t.TempDir()
	sparse, err := os.Create(filepath.Join(dir, "sparse.raw"))
	if err != nil {
		t.Fatal(err)
	}
	defer sparse.Close()
	if err := sparse.Truncate(size); err != nil {
		t.Fatal(err)
	}
	for _, off := range []int64{0, 1<<20 + 70000, size - 500} {
		end := min(off+3000, size)
		if _, err := sparse.WriteAt(content[off:end], off); err != nil {
			t.Fatal(err)
		}
	}
	dense := filepath.Join(dir, "dense.raw")
	if err := os.WriteFile(dense, content, 0o644); err != nil {
		t.Fatal(err)
	}
	denseF, err := os.Open(dense)
	if err != nil {
		t.Fatal(err)
	}
	defer denseF.Close()
	// Data in cluster 0, in cluster 17 (1 MiB+70000), and in the last,
	// partial cluster: the qcow2 virtual size is rounded up to whole
	// sectors, 3 MiB+1024.
	want := int64(2*DefaultClusterSize + 1024)
	for name, f := range map[string]*os.File{"sparse": sparse, "dense": denseF} {
		img, err := Open(f, size, OpenOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p, err := img.Plan(t.Context(), Options{})
		if err != nil {
			t.Fatal(err)
		}
		if got, ok := p.DataBytes(); !ok || got != want {
			t.Errorf("%s source: DataBytes %d (%v), want %d", name, got, ok, want)
		}
	}
	p := rawPlan(t, content)
	if _, ok := p.DataBytes(); ok {
		t.Error("raw output claims a data figure")
	}
}

// TestSpoolRejectsTruncatedStreams: a gzip, zstd or xz stream cut short is
// rejected, not spooled as a shorter image (the decoders report the cut
// as io.ErrUnexpectedEOF, which io.ReadFull also returns at an ordinary
// end).
func TestSpoolRejectsTruncatedStreams(t *testing.T) {
	data := sparseRaw(4<<20, 0, 1<<20, 3<<20)
	for i := range data { // data that compresses, but not to nothing
		data[i] |= byte(i % 7)
	}
	var gz, xzb bytes.Buffer
	gw := gzip.NewWriter(&gz)
	gw.Write(data)
	gw.Close()
	xw, err := xz.NewWriter(&xzb)
	if err != nil {
		t.Fatal(err)
	}
	xw.Write(data)
	xw.Close()
	enc, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	for w, whole := range map[Wrapper][]byte{WrapperGzip: gz.Bytes(), WrapperZstd: enc.EncodeAll(data, nil), WrapperXZ: xzb.Bytes()} {
		for _, cut := range []int{len(whole) / 2, len(whole) - 4} {
			t.Run(fmt.Sprintf("%s/%d of %d", w, cut, len(whole)), func(t *testing.T) {
				r, got, err := Unwrap(bytes.NewReader(whole[:cut]))
				if got != w {
					t.Fatalf("Unwrap = %v, %v", got, err)
				}
				if err != nil { // the cut shows in the head already
					if re := reject.As(err); re == nil || re.Reason != reject.Wrapper {
						t.Fatalf("Unwrap: %v, want a %s rejection", err, reject.Wrapper)
					}
					return
				}
				defer r.Close()
				f, err := os.Create(filepath.Join(t.TempDir(), "spool"))
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				n, err := Spool(t.Context(), r, f, 64<<20)
				if re := reject.As(err); re == nil || re.Reason != reject.Wrapper {
					t.Fatalf("spooled %d bytes with err %v, want a %s rejection", n, err, reject.Wrapper)
				}
			})
		}
	}
}
