package convert

import (
	"bytes"
	"context"
	"encoding/binary"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/klauspost/compress/flate"
	"github.com/klauspost/compress/zstd"

	"github.com/imagepipe/imagepipe/internal/reject"
)

// fuzzMaxVirtual keeps fuzzed images small enough to convert many per second.
const fuzzMaxVirtual = 1 << 20

// countingWriter counts bytes and discards them.
type countingWriter struct{ n int64 }

func (c *countingWriter) Write(b []byte) (int, error) { c.n += int64(len(b)); return len(b), nil }

// fuzzOptions are the conversion options of the fuzz targets: small output
// clusters so that tiny images still have several, one reader per batch.
var fuzzOptions = Options{ClusterSize: 4096, Concurrency: 2}

// checkImage runs everything a command may run on untrusted bytes and
// fails on every broken invariant of the engine:
//
//   - Open, Verify, Plan and Write fail only with a *reject.Error;
//   - the verdict is one: Plan and WriteFile, each run first on a fresh
//     copy of the image, give Verify's rejection (inspect, convert and
//     import agree);
//   - an accepted image converts: Plan and Write succeed for raw and qcow2
//     output, each output is Plan.Size bytes, raw output is the virtual
//     size, the qcow2 output reopens, verifies and reads back as the same
//     raw bytes, and WriteFile succeeds on a fresh copy;
//   - an accepted qcow2 image reaches no host cluster twice (checked here
//     independently of Verify, see reusedCluster);
//   - work and output are bounded by the file: Verify reads at most twice
//     its size, Write at most once, and the guest data is at most
//     maxExpansion+1 bytes per byte of file.
//
// For an accepted image it returns what it wrote (for checkWithQEMU), nil
// otherwise.
func checkImage(t *testing.T, data []byte) *converted {
	ctx := context.Background()
	opts := OpenOptions{MaxVirtualSize: fuzzMaxVirtual}
	img, rc, err := openBytes(t, data, opts)
	if err != nil {
		if reject.As(err) == nil {
			t.Fatalf("Open returned a non-rejection error: %v", err)
		}
		return nil
	}
	size := int64(len(data))
	rc.n.Store(0)
	sum, verr := img.Verify(ctx)
	if n := rc.n.Load(); n > 2*size {
		t.Fatalf("Verify read %d bytes of a %d-byte file", n, size)
	}
	if verr != nil {
		re := reject.As(verr)
		if re == nil {
			t.Fatalf("Verify returned a non-rejection error: %v", verr)
		}
		// The same bytes through another entry point, first.
		fresh, _, err := openBytes(t, data, opts)
		if err != nil {
			t.Fatalf("the second Open disagrees with the first: %v", err)
		}
		_, perr := fresh.Plan(ctx, fuzzOptions)
		if got := reject.As(perr); got == nil || *got != *re {
			t.Fatalf("Plan's verdict %v differs from Verify's %v", perr, verr)
		}
		fresh, _, _ = openBytes(t, data, opts)
		_, werr := fresh.WriteFile(ctx, fuzzFile(t), fuzzOptions)
		if got := reject.As(werr); got == nil || *got != *re {
			t.Fatalf("WriteFile's verdict %v differs from Verify's %v", werr, verr)
		}
		return nil
	}
	info := img.Info()
	if info.Format == FormatQCOW2 {
		if why := reusedCluster(data, info); why != "" {
			t.Fatalf("accepted an image that reuses host clusters: %s", why)
		}
	}
	if sum.AllocatedBytes > info.VirtualSize {
		t.Fatalf("%d bytes allocated in a %d-byte disk", sum.AllocatedBytes, info.VirtualSize)
	}

	// Raw output of a guest that probes as another format is refused
	// (rawout.go); the same guest read back from qcow2 output must be too.
	ambiguous := img.checkRawOutput(ctx)
	if ambiguous != nil {
		if re := reject.As(ambiguous); re == nil || re.Reason != reject.AmbiguousRaw {
			t.Fatalf("the raw-output check failed with %v", ambiguous)
		}
	}
	var rawOut []byte
	if ambiguous == nil {
		rawOut = convertChecked(t, img, rc, Options{To: FormatRaw}, size)
		if int64(len(rawOut)) != info.VirtualSize {
			t.Fatalf("raw output is %d bytes for a virtual size of %d", len(rawOut), info.VirtualSize)
		}
	}
	qcowOut := convertChecked(t, img, rc, fuzzOptions, size)
	// The one-pass file conversion, on a fresh copy, accepts it too.
	fresh, _, _ := openBytes(t, data, opts)
	f := fuzzFile(t)
	n, err := fresh.WriteFile(ctx, f, fuzzOptions)
	if err != nil {
		t.Fatalf("WriteFile of an accepted image: %v", err)
	}
	if st, err := f.Stat(); err != nil || st.Size() != n {
		t.Fatalf("WriteFile said %d bytes, the file has %v (%v)", n, st.Size(), err)
	}
	fileOut := make([]byte, n)
	if _, err := f.ReadAt(fileOut, 0); err != nil {
		t.Fatal(err)
	}
	out := &converted{input: data, format: info.Format, qcow2: qcowOut, file: fileOut, raw: rawOut}
	back, _, err := openBytes(t, qcowOut, OpenOptions{MaxVirtualSize: fuzzMaxVirtual})
	if err != nil {
		t.Fatalf("the qcow2 output does not open: %v", err)
	}
	if back.Info().VirtualSize != info.VirtualSize {
		t.Fatalf("the qcow2 output's virtual size is %d, the input's %d", back.Info().VirtualSize, info.VirtualSize)
	}
	if ambiguous != nil {
		if again := back.checkRawOutput(ctx); again == nil || again.Error() != ambiguous.Error() {
			t.Fatalf("raw output of the input is refused (%v) but of its qcow2 copy: %v", ambiguous, again)
		}
		return out
	}
	if !bytes.Equal(convertChecked(t, back, nil, Options{To: FormatRaw}, 0), rawOut) {
		t.Fatal("the qcow2 output reads back differently from the raw output")
	}
	return out
}

// fuzzOut is one output file per fuzzing process, unlinked at once so
// that nothing is left behind.
var fuzzOut *os.File

func fuzzFile(t *testing.T) *os.File {
	if fuzzOut == nil {
		f, err := os.CreateTemp("", "convert-fuzz-*")
		if err != nil {
			t.Fatal(err)
		}
		os.Remove(f.Name())
		fuzzOut = f
	}
	return fuzzOut
}

// convertChecked plans and writes img with opts and returns the output,
// failing on any error or on a size other than the plan's. With rc, it
// checks that the plan and Write each read at most fileSize bytes and that
// the guest data is at most maxExpansion+1 bytes per byte of file.
func convertChecked(t *testing.T, img *Image, rc *readCounter, opts Options, fileSize int64) []byte {
	ctx := context.Background()
	if rc != nil {
		rc.n.Store(0)
	}
	p, err := img.Plan(ctx, opts)
	if err != nil {
		t.Fatalf("Plan(%s) of a verified image: %v", opts.To, err)
	}
	if rc != nil && rc.n.Load() > fileSize {
		t.Fatalf("Plan(%s) read %d bytes of a %d-byte file", opts.To, rc.n.Load(), fileSize)
	}
	if data, ok := p.DataBytes(); ok && rc != nil && data > (maxExpansion+1)*fileSize {
		t.Fatalf("%d bytes of guest data from a %d-byte file", data, fileSize)
	}
	if rc != nil {
		rc.n.Store(0)
	}
	var out bytes.Buffer
	out.Grow(int(p.Size()))
	if err := p.Write(ctx, &out); err != nil {
		t.Fatalf("Write(%s) of a verified image: %v", opts.To, err)
	}
	if rc != nil && rc.n.Load() > fileSize {
		t.Fatalf("Write(%s) read %d bytes of a %d-byte file", opts.To, rc.n.Load(), fileSize)
	}
	if int64(out.Len()) != p.Size() {
		t.Fatalf("%s output is %d bytes, the plan said %d", opts.To, out.Len(), p.Size())
	}
	return out.Bytes()
}

// FuzzOpen feeds whole files to the engine. Seeds: testdata/fuzz/FuzzOpen
// (heads of the hostile corpus, see test/hostile, and whole images QEMU
// made, see qemuSeeds) and small valid images.
func FuzzOpen(f *testing.F) {
	for _, seed := range validSeeds(f) {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) { fuzzCheck(t, data) })
}

// FuzzQCOW2Header checks that header parsing never panics and that what it
// accepts satisfies the invariants the reader relies on. Seeds: the heads
// of validSeeds (this package's header, and a raw disk), and the header
// clusters QEMU wrote for the qemu-* FuzzOpen seeds (versions 2 and 3,
// feature-name extensions, zstd).
func FuzzQCOW2Header(f *testing.F) {
	for _, seed := range validSeeds(f) {
		f.Add(seed[:min(len(seed), 128)], int64(len(seed))) // the header and its end-of-extensions mark
	}
	heads, sizes := qemuSeedHeads(f)
	for i, head := range heads {
		f.Add(head, sizes[i])
	}
	f.Fuzz(func(t *testing.T, head []byte, fileSize int64) {
		if len(head) > 1024 {
			return
		}
		if fileSize < int64(len(head)) {
			fileSize = int64(len(head))
		}
		h, err := parseQCOW2Header(head, fileSize, fuzzMaxVirtual)
		if err != nil {
			if reject.As(err) == nil {
				t.Fatalf("non-rejection error: %v", err)
			}
			return
		}
		cs := uint64(h.clusterSize())
		switch {
		case h.clusterBits < minClusterBits || h.clusterBits > maxClusterBits:
			t.Fatalf("accepted cluster_bits %d", h.clusterBits)
		case h.size == 0 || h.size > fuzzMaxVirtual || h.size%512 != 0:
			t.Fatalf("accepted virtual size %d", h.size)
		case uint64(h.l1Size) < h.l1Needed() || uint64(h.l1Size)*8 > maxL1Bytes:
			t.Fatalf("accepted l1_size %d for size %d", h.l1Size, h.size)
		case h.l1Offset == 0 || h.l1Offset%cs != 0 || h.l1Offset+h.l1Needed()*8 > uint64(fileSize):
			t.Fatalf("accepted an L1 table at %#x (%d bytes) in a %d-byte file", h.l1Offset, h.l1Needed()*8, fileSize)
		case h.refTableOffset == 0 || h.refTableOffset%cs != 0 || h.refTableOffset >= uint64(fileSize):
			t.Fatalf("accepted a refcount table at %#x in a %d-byte file", h.refTableOffset, fileSize)
		case h.refTableCluster == 0 || uint64(h.refTableCluster)*cs > maxRefcountTableBytes:
			t.Fatalf("accepted a refcount table of %d clusters", h.refTableCluster)
		case h.incompatible&^incompatKnownToQEMU != 0 || h.incompatible&(incompatCorrupt|incompatDataFile|incompatExtendedL2) != 0:
			t.Fatalf("accepted incompatible features %#x", h.incompatible)
		case h.compression != compressionZlib && h.compression != compressionZstd:
			t.Fatalf("accepted compression type %d", h.compression)
		case h.nbSnapshots > maxSnapshots:
			t.Fatalf("accepted %d snapshots", h.nbSnapshots)
		}
	})
}

// FuzzL2Table builds a well-formed 512-byte-cluster qcow2 around a fuzzed
// L2 table and fuzzed compressed bytes, so every L2 entry shape (data,
// zero, compressed with any descriptor) and any stream reaches the reader.
// Inputs stay short (Go's minimiser takes time quadratic in their length):
// the data cluster is the builder's, the fuzzed bytes follow it. Seeds:
// testdata/fuzz/FuzzL2Table and the ones below.
func FuzzL2Table(f *testing.F) {
	for _, s := range l2Seeds(f) {
		f.Add(s.l2, s.comp, s.zstd)
	}
	f.Fuzz(func(t *testing.T, l2, comp []byte, zstd bool) {
		if img, ok := l2TableImage(l2, comp, zstd); ok {
			fuzzCheck(t, img)
		}
	})
}

// l2TableImage is the image of a FuzzL2Table input, false for an input
// too long to fuzz.
func l2TableImage(l2, comp []byte, zstd bool) ([]byte, bool) {
	if len(l2) > 512 || len(comp) > 1024 {
		return nil, false
	}
	return tinyQCOW2(l2, comp, zstd), true
}

type l2Seed struct {
	l2, comp []byte
	zstd     bool
	want     reject.Reason // "" for an accepted image
	stored   int64         // the guest bytes qcow2 output stores at fuzzOptions
}

// l2Seeds are the FuzzL2Table seeds, each reaching a case of its own:
//
//   - a data, a zero and a compressed cluster, once with each codec;
//   - a cluster of zeros and one of ones compressed into 8 bytes at the
//     end of a sector, small enough that Plan's zero scan decompresses
//     them (compressedScanRatio): one is stored, the other is not;
//   - an incompressible cluster, whose stream spans two sectors;
//   - entries as an image with snapshots has them: a data cluster without
//     the COPIED flag, and a zero-flagged entry that keeps the offset of
//     a cluster of non-zero bytes (it reads as zeros);
//   - the same descriptor twice, rejected.
func l2Seeds(tb testing.TB) []l2Seed {
	const cs, comp = 512, 5 * 512 // tinyQCOW2's cluster size and first fuzzed byte
	// compressed is the descriptor of n stream bytes at host, with the
	// sector count QEMU writes.
	compressed := func(host, n int) uint64 {
		return entryCompressed | uint64((host+n-1)/512-host/512)<<(62-(9-8)) | uint64(host)
	}
	table := func(entries ...uint64) []byte {
		l2 := make([]byte, 8*len(entries))
		for i, e := range entries {
			binary.BigEndian.PutUint64(l2[8*i:], e)
		}
		return l2
	}
	pattern := bytes.Repeat([]byte("ab"), cs/2)
	var seeds []l2Seed
	for _, useZstd := range []bool{false, true} {
		stream := compressCluster(tb, pattern, useZstd)
		seeds = append(seeds, l2Seed{table(entryCopied|4*cs, entryZero, compressed(comp, len(stream))), stream, useZstd, "", 4096})
	}
	for _, fill := range []byte{0, 1} {
		stream := compressCluster(tb, bytes.Repeat([]byte{fill}, cs), false)
		if len(stream) > cs/compressedScanRatio {
			tb.Fatalf("a cluster of %#x compresses into %d bytes; the zero scan decompresses at most %d", fill, len(stream), cs/compressedScanRatio)
		}
		pad := cs - len(stream) // ends the stream with its sector
		seeds = append(seeds, l2Seed{table(0, compressed(comp+pad, len(stream))), append(bytes.Repeat([]byte{0xee}, pad), stream...), false, "", int64(fill) * 4096})
	}
	noise := make([]byte, cs)
	rng := rand.New(rand.NewPCG(5, 12))
	for i := range noise {
		noise[i] = byte(rng.Uint32())
	}
	stream := compressCluster(tb, noise, false)
	seeds = append(seeds, l2Seed{table(0, 0, compressed(comp, len(stream))), stream, false, "", 4096})
	stream = compressCluster(tb, pattern, false)
	seeds = append(seeds,
		l2Seed{table(4*cs, entryZero|4*cs), nil, false, "", 4096},
		l2Seed{table(0, compressed(comp, len(stream)), compressed(comp, len(stream))), stream, false, reject.SharedCluster, 0},
	)
	return seeds
}

// TestL2TableSeeds checks the FuzzL2Table seeds mean what l2Seeds says:
// the verdict, and for accepted ones what qcow2 output stores.
func TestL2TableSeeds(t *testing.T) {
	for i, s := range l2Seeds(t) {
		b, ok := l2TableImage(s.l2, s.comp, s.zstd)
		if !ok {
			t.Fatalf("seed %d is too long for FuzzL2Table", i)
		}
		img, _, err := openBytes(t, b, OpenOptions{})
		var p *Plan
		if err == nil {
			p, err = img.Plan(t.Context(), fuzzOptions)
		}
		if re := reject.As(err); (s.want == "" && err != nil) || (s.want != "" && (re == nil || re.Reason != s.want)) {
			t.Errorf("seed %d: %v, want %q", i, err, s.want)
			continue
		}
		if p == nil {
			continue
		}
		if n, _ := p.DataBytes(); n != s.stored {
			t.Errorf("seed %d: qcow2 output stores %d guest bytes, want %d", i, n, s.stored)
		}
	}
}

// tinyQCOW2 lays out a 32 KiB-virtual image with 512-byte clusters:
// header | L1 | L2 (given) | refcount table | a data cluster of 0x42 |
// comp from cluster 5 on.
func tinyQCOW2(l2, comp []byte, zstd bool) []byte {
	const cs = 512
	img := make([]byte, 5*cs, 5*cs+len(comp))
	be := binary.BigEndian
	copy(img, "QFI\xfb")
	be.PutUint32(img[4:], 3)
	be.PutUint32(img[20:], 9)
	be.PutUint64(img[24:], 64*cs) // one L2 table's worth
	be.PutUint32(img[36:], 1)
	be.PutUint64(img[40:], 1*cs)
	be.PutUint64(img[48:], 3*cs)
	be.PutUint32(img[56:], 1)
	be.PutUint32(img[96:], 4)
	be.PutUint32(img[100:], 112)
	if zstd {
		be.PutUint64(img[72:], incompatCompression)
		img[104] = compressionZstd
	}
	be.PutUint64(img[cs:], entryCopied|2*cs)
	copy(img[2*cs:3*cs], l2)
	copy(img[4*cs:], bytes.Repeat([]byte{0x42}, cs))
	return append(img, comp...)
}

// testZstd is one encoder for every test: EncodeAll is safe for concurrent use.
var testZstd, _ = zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1))

// compressCluster compresses one cluster as QEMU stores it.
func compressCluster(tb testing.TB, cluster []byte, useZstd bool) []byte {
	var buf bytes.Buffer
	if useZstd {
		return testZstd.EncodeAll(cluster, nil)
	}
	w, err := flate.NewWriter(&buf, flate.DefaultCompression)
	if err != nil {
		tb.Fatal(err)
	}
	w.Write(cluster)
	w.Close()
	return buf.Bytes()
}

// validSeeds are small valid images made by this package's own writer.
func validSeeds(tb testing.TB) [][]byte {
	raw := make([]byte, 40<<10)
	copy(raw[1000:], bytes.Repeat([]byte("seed"), 300))
	raw[len(raw)-1] = 1
	img, err := Open(bytes.NewReader(raw), int64(len(raw)), OpenOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	var out bytes.Buffer
	p, err := img.Plan(context.Background(), Options{ClusterSize: 512})
	if err == nil {
		err = p.Write(context.Background(), &out)
	}
	if err != nil {
		tb.Fatal(err)
	}
	return [][]byte{out.Bytes(), raw[:4096]}
}
