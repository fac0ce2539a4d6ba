package convert

import (
	"bytes"
	"context"
	"encoding/binary"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/imagepipe/imagepipe/internal/reject"
)

// amplifier is the image of the issue: every L1 entry points to one L2
// table and every L2 entry to one data cluster, so a file of a few hundred
// KiB claims vsize bytes of data.
func amplifier(vsize uint64) []byte {
	q := newQCOWBuilder(16, vsize, false)
	l2 := q.alloc(1)
	d := q.alloc(1)
	copy(q.b[d:], bytes.Repeat([]byte("amplify!"), int(q.cs/8)))
	h := qcowHeader{clusterBits: 16, size: vsize}
	for i := range int64(h.l1Needed()) {
		q.setL1(i, l2)
	}
	for j := range q.cs / 8 {
		q.setL2(l2, j, q.data(d))
	}
	return q.bytes()
}

// oneL2Table points every L1 entry at one L2 table with a single data
// cluster: sharing the table alone.
func oneL2Table(vsize uint64) []byte {
	q := newQCOWBuilder(16, vsize, false)
	l2 := q.alloc(1)
	d := q.alloc(1)
	q.b[d] = 1
	h := qcowHeader{clusterBits: 16, size: vsize}
	for i := range int64(h.l1Needed()) {
		q.setL1(i, l2)
	}
	q.setL2(l2, 0, q.data(d))
	return q.bytes()
}

// withTable is a 64 KiB-cluster image of 1 GiB (two L1 entries) with one
// L2 table behind L1 entry 0, handed to edit.
func withTable(edit func(q *qcowBuilder, l2 int64)) []byte {
	q := newQCOWBuilder(16, 1<<30, false)
	l2 := q.alloc(1)
	q.setL1(0, l2)
	edit(q, l2)
	return q.bytes()
}

// reusedDescriptor is a 2 MiB-cluster image whose 262144 L2 entries all
// hold the same compressed descriptor: 512 GiB of guest data from one
// stream. garbage makes the stream undecodable (the slow case: each
// attempt reads up to 4 MiB).
func reusedDescriptor(garbage bool) []byte {
	q := newQCOWBuilder(21, 512<<30, true)
	l2 := q.alloc(1)
	q.setL1(0, l2)
	data := q.alloc(1)
	stream := minimalZstd(q.cs, 0x5a)
	if garbage {
		stream = bytes.Repeat([]byte{0xff}, int(q.cs))
	}
	copy(q.b[data:], stream)
	e := q.compressed(data, int64(len(stream)))
	for j := range q.cs / 8 {
		q.setL2(l2, j, e)
	}
	return q.bytes()
}

// compressedAt is a 64 KiB-cluster image whose guest cluster 0 is a valid
// zlib stream written where place says, which may allocate.
func compressedAt(place func(q *qcowBuilder, l2 int64) int64) func(t *testing.T) []byte {
	return func(t *testing.T) []byte {
		q := newQCOWBuilder(16, 1<<20, false)
		l2 := q.alloc(1)
		q.setL1(0, l2)
		stream := compressCluster(t, bytes.Repeat([]byte("ab"), int(q.cs/2)), false)
		host := place(q, l2)
		copy(q.b[host:], stream)
		q.setL2(l2, 0, q.compressed(host, int64(len(stream))))
		return q.bytes()
	}
}

// lazy defers building an image until a test needs it.
func lazy[A any](build func(A) []byte, arg A) func(*testing.T) []byte {
	return func(*testing.T) []byte { return build(arg) }
}

// hostileCases are images whose tables reuse host clusters or bytes, each
// with the one reason every command must give.
var hostileCases = []struct {
	name  string
	build func(t *testing.T) []byte
	want  reject.Reason
}{
	// The images: found at the second L2 entry of the first table.
	{"issue/2TiB-one-table-one-cluster", lazy(amplifier, 2<<40), reject.SharedCluster},
	{"issue/16GiB-one-table-one-cluster", lazy(amplifier, 16<<30), reject.SharedCluster},
	{"l2/one-table-for-every-l1-entry", lazy(oneL2Table, 2<<40), reject.SharedL2Table},
	{"l2/two-l1-entries-one-table", lazy(withTable, func(q *qcowBuilder, l2 int64) {
		q.setL1(1, l2)
	}), reject.SharedL2Table},
	{"data/cluster-referenced-twice", lazy(withTable, func(q *qcowBuilder, l2 int64) {
		d := q.alloc(1)
		q.setL2(l2, 0, q.data(d))
		q.setL2(l2, 5, q.data(d))
	}), reject.SharedCluster},
	// Metadata read as guest data, and guest data read as metadata.
	{"data/is-its-own-l2-table", lazy(withTable, func(q *qcowBuilder, l2 int64) {
		q.setL2(l2, 0, q.data(l2))
	}), reject.MetadataOverlap},
	{"data/on-the-l1-table", lazy(withTable, func(q *qcowBuilder, l2 int64) {
		q.setL2(l2, 0, q.data(q.l1))
	}), reject.MetadataOverlap},
	{"data/on-the-refcount-table", lazy(withTable, func(q *qcowBuilder, l2 int64) {
		q.setL2(l2, 0, q.data(q.rt))
	}), reject.MetadataOverlap},
	{"l2/on-the-l1-table", lazy(withTable, func(q *qcowBuilder, l2 int64) {
		q.setL1(1, q.l1)
	}), reject.MetadataOverlap},
	{"l2/on-the-refcount-table", lazy(withTable, func(q *qcowBuilder, l2 int64) {
		q.setL1(1, q.rt)
	}), reject.MetadataOverlap},
	{"l2/on-an-earlier-data-cluster", lazy(withTable, func(q *qcowBuilder, l2 int64) {
		d := q.alloc(1)
		q.setL2(l2, 0, q.data(d))
		q.setL1(1, d)
	}), reject.MetadataOverlap},
	{"data/on-a-later-l2-table", lazy(withTable, func(q *qcowBuilder, l2 int64) {
		l2b := q.alloc(1)
		q.setL2(l2, 0, q.data(l2b))
		q.setL1(1, l2b)
	}), reject.MetadataOverlap},
	// One compressed descriptor for every cluster of a 512 GiB disk: refused
	// before anything is decompressed.
	{"compressed/one-descriptor-262144-times", lazy(reusedDescriptor, false), reject.SharedCluster},
	{"compressed/one-garbage-descriptor-262144-times", lazy(reusedDescriptor, true), reject.SharedCluster},
	// Distinct starts whose data overlap: cluster 0's stream needs bytes
	// past the start of cluster 1's.
	{"compressed/next-start-inside-stream", func(t *testing.T) []byte {
		q := newQCOWBuilder(16, 1<<20, false)
		l2 := q.alloc(1)
		q.setL1(0, l2)
		d := q.alloc(1)
		stream := compressCluster(t, bytes.Repeat([]byte("abc"), int(q.cs/3+1))[:q.cs], false)
		copy(q.b[d:], stream)
		q.setL2(l2, 0, q.compressed(d, int64(len(stream))))
		q.setL2(l2, 1, q.compressed(d+1, int64(len(stream))-1))
		return q.bytes()
	}, reject.SharedCluster},
	{"compressed/inside-a-data-cluster", compressedAt(func(q *qcowBuilder, l2 int64) int64 {
		d := q.alloc(1)
		q.setL2(l2, 1, q.data(d))
		return d + 100
	}), reject.SharedCluster},
	{"compressed/inside-the-l2-table", compressedAt(func(q *qcowBuilder, l2 int64) int64 {
		return l2 + q.cs/2 // entries past the 1 MiB disk are never read
	}), reject.MetadataOverlap},
	{"compressed/inside-the-l1-table", compressedAt(func(q *qcowBuilder, l2 int64) int64 {
		return q.l1 + 64
	}), reject.MetadataOverlap},
	// A zstd frame claiming more than the format's 128 KiB per block: the
	// decoder or the ratio check refuses it.
	{"compressed/beyond-the-codec-ratio", func(t *testing.T) []byte {
		q := newQCOWBuilder(21, 2<<20, true)
		l2 := q.alloc(1)
		q.setL1(0, l2)
		d := q.alloc(1)
		frame := []byte{0x28, 0xb5, 0x2f, 0xfd, 0xa0, 0, 0, 0x20, 0}
		big, one := uint32(2<<20-1)<<3|1<<1, uint32(1)<<3|1<<1|1
		frame = append(frame, byte(big), byte(big>>8), byte(big>>16), 0x77, byte(one), byte(one>>8), byte(one>>16), 0x77)
		copy(q.b[d:], frame)
		q.setL2(l2, 0, q.compressed(d, int64(len(frame))))
		return q.bytes()
	}, reject.CompressedCluster},
	// Legal streams, each as short as zstd allows, claiming more guest data
	// per byte of file than deflate could: 512 MiB from 362 KiB.
	{"compressed/zstd-bomb", func(*testing.T) []byte { return minimalStreams(16, true, 8192, 0)() }, reject.CompressionRatio},
	// Distinct starts, each a valid stream, all decoding the same bytes: a
	// chain of empty prefixes (empty stored deflate blocks, zstd skippable
	// frames) before one real stream. Each cluster may read only up to the
	// next start, so all but the last run out of input.
	{"compressed/deflate-empty-block-chain", prefixChain(false), reject.SharedCluster},
	{"compressed/zstd-skippable-frame-chain", prefixChain(true), reject.SharedCluster},
	// QEMU reads 512 of these 1000 bytes.
	{"virtual-size/1000-bytes", func(t *testing.T) []byte {
		q := newQCOWBuilder(16, 1024, false)
		q.put(24, 1000)
		return q.bytes()
	}, reject.VirtualSize},
}

// emptyPrefix is a piece of compressed stream that produces nothing: an
// empty, non-final stored deflate block, or an empty zstd skippable frame.
func emptyPrefix(useZstd bool) []byte {
	if useZstd {
		return []byte{0x50, 0x2a, 0x4d, 0x18, 0, 0, 0, 0}
	}
	return []byte{0, 0, 0, 0xff, 0xff}
}

// prefixChain is a 64 KiB-cluster image of 64 clusters whose compressed
// descriptors start at successive empty prefixes of one stream: without
// the next-start rule, each would decode the same cluster, 64 clusters
// from one stream's bytes.
func prefixChain(useZstd bool) func(t *testing.T) []byte {
	return func(t *testing.T) []byte {
		const n = 64
		q := newQCOWBuilder(16, n<<16, useZstd)
		l2 := q.alloc(1)
		q.setL1(0, l2)
		stream := compressCluster(t, bytes.Repeat([]byte("chain"), 1<<14)[:1<<16], useZstd)
		var chain []byte
		for range n - 1 {
			chain = append(chain, emptyPrefix(useZstd)...)
		}
		chain = append(chain, stream...)
		d := q.alloc((int64(len(chain)) + q.cs - 1) / q.cs)
		copy(q.b[d:], chain)
		p := int64(len(emptyPrefix(useZstd)))
		for i := range int64(n) {
			q.setL2(l2, i, q.compressed(d+i*p, int64(len(chain))-i*p))
		}
		// Each descriptor alone is a valid cluster.
		for _, i := range []int64{0, n / 2} {
			img, _, err := openBytes(t, q.bytes(), OpenOptions{})
			if err != nil {
				t.Fatal(err)
			}
			src := img.src.(*qcow2Source)
			src.starts, src.uses = newStartSet(int64(len(q.b))), newHostMap(int64(len(q.b)), q.bits)
			host, clen := src.h.compressedDescriptor(binary.BigEndian.Uint64(q.b[l2+8*i:]))
			if err := src.decompress(extent{kind: extentCompressed, host: host, clen: clen, length: q.cs}, make([]byte, q.cs), getScratch()); err != nil {
				t.Fatalf("descriptor %d alone does not decode: %v", i, err)
			}
		}
		return q.bytes()
	}
}

// TestHostileTablesRejectedEverywhere checks that every entry point gives
// the same rejection for images that reuse host clusters, and that judging
// one reads at most its own size: nothing is read twice.
func TestHostileTablesRejectedEverywhere(t *testing.T) {
	for _, tc := range hostileCases {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.build(t)
			img, rc, err := openBytes(t, b, OpenOptions{})
			if err == nil {
				_, err = img.Verify(t.Context())
			}
			re := reject.As(err)
			if re == nil || re.Reason != tc.want {
				t.Fatalf("got %v, want a rejection for %s", err, tc.want)
			}
			t.Logf("%d-byte file: %s", len(b), re.Detail)
			if img == nil {
				return
			}
			if rc.n.Load() > int64(len(b)) {
				t.Errorf("judging read %d bytes of a %d-byte file", rc.n.Load(), len(b))
			}
			checkSameVerdictEverywhere(t, b, re)
		})
	}
}

// checkSameVerdictEverywhere opens b afresh for each of verdictSteps, so
// that nothing is remembered, and checks that each reaches re by itself.
func checkSameVerdictEverywhere(t *testing.T, b []byte, re *reject.Error) {
	t.Helper()
	for _, step := range verdictSteps {
		fresh, _, err := openBytes(t, b, OpenOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := reject.As(step.run(t, fresh)); got == nil || *got != *re {
			t.Errorf("%s: got %v, want %v", step.name, got, re)
		}
	}
}

// verdictSteps are the engine's entry points a command may call first.
var verdictSteps = []struct {
	name string
	run  func(t *testing.T, img *Image) error
}{
	{"Verify", func(t *testing.T, img *Image) error { _, err := img.Verify(t.Context()); return err }},
	{"Plan raw", func(t *testing.T, img *Image) error {
		_, err := img.Plan(t.Context(), Options{To: FormatRaw})
		return err
	}},
	{"Plan qcow2", func(t *testing.T, img *Image) error { _, err := img.Plan(t.Context(), Options{}); return err }},
	{"WriteFile", func(t *testing.T, img *Image) error {
		f, err := os.Create(filepath.Join(t.TempDir(), "out"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		_, err = img.WriteFile(t.Context(), f, Options{})
		return err
	}},
}

// packedImage is a compressed image laid out as qemu-img convert -c does:
// streams byte-packed back to back (each descriptor's last sector holds the
// start of the next stream), runs of compressed clusters crossing host
// cluster boundaries, data clusters for incompressible clusters in between.
// It returns the image and the raw disk it holds.
func packedImage(t *testing.T, clusterBits uint32, useZstd bool) (img, disk []byte) {
	cs := int64(1) << clusterBits
	clusters := max(6, min(96, (4<<20)/cs))
	q := newQCOWBuilder(clusterBits, uint64(clusters*cs), useZstd)
	h := qcowHeader{clusterBits: clusterBits, size: uint64(clusters * cs)}
	tables := make([]int64, h.l1Needed())
	for i := range tables {
		tables[i] = q.alloc(1)
		q.setL1(int64(i), tables[i])
	}
	disk = make([]byte, clusters*cs)
	rng := rand.New(rand.NewPCG(uint64(clusterBits), 9))
	text := make([]byte, 4093)
	for i := range text {
		text[i] = "abcdefgh  \n"[rng.IntN(11)]
	}
	p := &packer{q: q}
	for c := range clusters {
		guest := disk[c*cs : (c+1)*cs]
		switch c % 5 {
		case 0: // random: stored uncompressed
			for i := 0; i < len(guest); i += 8 {
				binary.LittleEndian.PutUint64(guest[i:], rng.Uint64())
			}
			d := q.alloc(1)
			copy(q.b[d:], guest)
			q.setL2(tables[c/(cs/8)], c%(cs/8), q.data(d))
			continue
		case 1: // a constant, non-zero byte
			for i := range guest {
				guest[i] = byte(c)
			}
		case 2: // zeros, compressed all the same
		default: // text-like: a shifted run of random words
			for i := range guest {
				guest[i] = text[(i+int(c)*7)%len(text)]
			}
		}
		stream := compressCluster(t, guest, useZstd)
		host := p.add(stream)
		q.setL2(tables[c/(cs/8)], c%(cs/8), q.compressed(host, int64(len(stream))))
	}
	return q.bytes(), disk
}

// TestBytePackedStreamsAccepted checks the rule against the layout QEMU
// writes: streams packed byte by byte, whose descriptors overlap the next
// stream's start, are accepted and read back exactly.
func TestBytePackedStreamsAccepted(t *testing.T) {
	for _, useZstd := range []bool{false, true} {
		for _, bits := range []uint32{9, 12, 16, 21} {
			b, disk := packedImage(t, bits, useZstd)
			img, _, err := openBytes(t, b, OpenOptions{})
			if err != nil {
				t.Fatal(err)
			}
			sum, err := img.Verify(t.Context())
			if err != nil {
				t.Fatalf("zstd %v, %d-byte clusters: %v", useZstd, 1<<bits, err)
			}
			clusters := max(6, min(96, int64(4<<20)>>bits))
			if want := clusters - (clusters+4)/5; sum.CompressedClusters != want {
				t.Errorf("%d compressed clusters", sum.CompressedClusters)
			}
			p, err := img.Plan(t.Context(), Options{To: FormatRaw})
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			if err := p.Write(t.Context(), &out); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(out.Bytes(), disk) {
				t.Errorf("zstd %v, %d-byte clusters: raw output differs from the disk", useZstd, 1<<bits)
			}
		}
	}
}

// TestWorkBoundedByFileSize builds the images that get the most guest data
// and decompression out of each byte of file, and checks the bound the
// package documentation states: Verify reads at most twice the file's
// size, a later pass at most its size, and the guest data is at most the
// file's size for an uncompressed image and 1033 times it otherwise.
func TestWorkBoundedByFileSize(t *testing.T) {
	cases := []struct {
		name  string
		build func() []byte
		ratio int64
	}{
		// Every guest cluster its own non-zero data cluster.
		{"uncompressed", minimalStreams(12, false, 0, 2048), 1},
		// The shortest streams each codec has, back to back, as many as
		// the expansion limit lets through (4096 64 KiB clusters in a
		// 342 KiB file: 784 bytes per byte).
		{"zstd-64KiB-rle", minimalStreams(16, true, 4096, 0), maxExpansion + 1},
		{"zstd-2MiB-rle", minimalStreams(21, true, 16, 0), maxExpansion + 1},
		{"zstd-512B-rle", minimalStreams(9, true, 4096, 0), maxExpansion + 1},
		{"zlib-64KiB-constant", minimalStreams(16, false, 1024, 0), maxExpansion + 1},
		{"zlib-512B-constant", minimalStreams(9, false, 4096, 0), maxExpansion + 1},
		{"mixed-4KiB", minimalStreams(12, true, 1024, 1024), maxExpansion + 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.build()
			size := int64(len(b))
			img, rc, err := openBytes(t, b, OpenOptions{})
			if err != nil {
				t.Fatal(err)
			}
			rc.n.Store(0)
			if _, err := img.Verify(t.Context()); err != nil {
				t.Fatal(err)
			}
			// The walk reads each table, then the decompression reads the
			// streams and the tables that point to them again.
			if n := rc.n.Load(); n > 2*size {
				t.Errorf("Verify read %d bytes of a %d-byte file, more than twice its size", n, size)
			}
			rc.n.Store(0)
			p, err := img.Plan(t.Context(), Options{})
			if err != nil {
				t.Fatal(err)
			}
			if n := rc.n.Load(); n > size {
				t.Errorf("Plan read %d bytes of a %d-byte file", n, size)
			}
			rc.n.Store(0)
			var w countingWriter
			if err := p.Write(t.Context(), &w); err != nil {
				t.Fatal(err)
			}
			if n := rc.n.Load(); n > size {
				t.Errorf("Write read %d bytes of a %d-byte file", n, size)
			}
			data, _ := p.DataBytes()
			t.Logf("%d-byte file: %d bytes of guest data (%.0f per byte of file), qcow2 output %d bytes", size, data, float64(data)/float64(size), w.n)
			if data > tc.ratio*size {
				t.Errorf("%d bytes of guest data from a %d-byte file: over %d per byte", data, size, tc.ratio)
			}
			// And the data is right: the compressed clusters hold 0x5a.
			if tc.ratio > 1 {
				rp, err := img.Plan(t.Context(), Options{To: FormatRaw})
				if err != nil {
					t.Fatal(err)
				}
				var raw bytes.Buffer
				if err := rp.Write(t.Context(), &raw); err != nil {
					t.Fatal(err)
				}
				if n := bytes.Count(raw.Bytes(), []byte{0x5a}); n != raw.Len() && !strings.HasPrefix(tc.name, "mixed") {
					t.Errorf("%d of %d bytes are 0x5a", n, raw.Len())
				}
			}
		})
	}
}

// minimalStreams is an image of n compressed clusters of a non-zero
// constant, each stored as the shortest stream the codec has (zlib: the best
// flate can do), packed back to back, followed by m uncompressed clusters,
// each its own data cluster.
func minimalStreams(clusterBits uint32, useZstd bool, n, m int64) func() []byte {
	return func() []byte {
		cs := int64(1) << clusterBits
		q := newQCOWBuilder(clusterBits, uint64((n+m)*cs), useZstd)
		h := qcowHeader{clusterBits: clusterBits, size: uint64((n + m) * cs)}
		tables := make([]int64, h.l1Needed())
		for i := range tables {
			tables[i] = q.alloc(1)
			q.setL1(int64(i), tables[i])
		}
		var stream []byte
		if useZstd {
			stream = minimalZstd(cs, 0x5a)
		} else {
			stream = compressCluster(nil, bytes.Repeat([]byte{0x5a}, int(cs)), false)
		}
		p := &packer{q: q}
		for c := range n + m {
			var e uint64
			if c < n {
				e = q.compressed(p.add(stream), int64(len(stream)))
			} else {
				d := q.alloc(1)
				q.b[d] = byte(c) | 1
				e = q.data(d)
			}
			q.setL2(tables[c/(cs/8)], c%(cs/8), e)
		}
		return q.bytes()
	}
}

// TestVerifyIsRemembered checks that a verdict is reached once per image
// and that an interrupted Verify leaves none behind.
func TestVerifyIsRemembered(t *testing.T) {
	b, _ := packedImage(t, 16, false)
	img, rc, err := openBytes(t, b, OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := img.Verify(ctx); err == nil || reject.As(err) != nil {
		t.Fatalf("cancelled Verify: %v", err)
	}
	if _, err := img.Verify(t.Context()); err != nil {
		t.Fatal(err)
	}
	read := rc.n.Load()
	if _, err := img.Verify(t.Context()); err != nil {
		t.Fatal(err)
	}
	if rc.n.Load() != read {
		t.Errorf("a second Verify read %d more bytes", rc.n.Load()-read)
	}
}

// TestWriteFileDecompressesOnce checks that WriteFile, unlike Verify and
// then Write, reads a compressed image's streams once: it runs only the walk
// first and decompresses while it writes.
func TestWriteFileDecompressesOnce(t *testing.T) {
	b, _ := packedImage(t, 16, false)
	var streams int64
	{
		img, _, err := openBytes(t, b, OpenOptions{})
		if err != nil {
			t.Fatal(err)
		}
		src := img.src.(*qcow2Source)
		err = src.extents(t.Context(), 0, img.info.VirtualSize, func(e extent) error {
			if e.kind == extentCompressed {
				streams += e.clen
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	read := func(verifyFirst bool) int64 {
		img, rc, err := openBytes(t, b, OpenOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if verifyFirst {
			if _, err := img.Verify(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
		f, err := os.Create(filepath.Join(t.TempDir(), "out.qcow2"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := img.WriteFile(t.Context(), f, Options{}); err != nil {
			t.Fatal(err)
		}
		return rc.n.Load()
	}
	once, twice := read(false), read(true)
	t.Logf("%d bytes of streams; WriteFile read %d bytes, Verify and WriteFile %d", streams, once, twice)
	if twice-once < streams/2 {
		t.Errorf("WriteFile read %d bytes, only %d fewer than Verify and WriteFile with %d bytes of streams", once, twice-once, streams)
	}
}

// TestStartSet checks both forms of the set of compressed starts: the
// sorted list, and the bitmap it turns into once that is smaller.
func TestStartSet(t *testing.T) {
	for _, tc := range []struct {
		name  string
		count int // starts added, one every 7 bytes from 100
		bits  bool
	}{{"list", 10, false}, {"bitmap", 1001, true}} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStartSet(64 * 1000) // the list is kept up to 1000 starts
			for i := tc.count - 1; i >= 0; i-- {
				s.add(100 + 7*int64(i))
			}
			if (s.bits != nil) != tc.bits {
				t.Fatalf("bitmap in use: %v, want %v", s.bits != nil, tc.bits)
			}
			if dup := s.finish(); dup != -1 {
				t.Fatalf("duplicate %d reported", dup)
			}
			last := 100 + 7*int64(tc.count-1)
			for _, q := range []struct{ off, limit, want int64 }{
				{100, 1 << 20, 107},
				{101, 1 << 20, 107},
				{100, 105, 105},          // the limit comes first
				{last, 1 << 20, 1 << 20}, // no later start
				{0, 1 << 20, 100},
			} {
				if got := s.next(q.off, q.limit); got != q.want {
					t.Errorf("next(%d, %d) = %d, want %d", q.off, q.limit, got, q.want)
				}
			}
			s.add(100 + 7*int64(tc.count/2))
			if dup := s.finish(); dup != 100+7*int64(tc.count/2) {
				t.Errorf("duplicate start reported as %d", dup)
			}
		})
	}
}
