package convert

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"testing"

	"github.com/klauspost/compress/flate"
	"github.com/klauspost/compress/zstd"
)

// fuzzMaxVirtual keeps fuzzed images small enough to convert many per second.
const fuzzMaxVirtual = 1 << 20

// countingWriter counts bytes and discards them.
type countingWriter struct{ n int64 }

func (c *countingWriter) Write(b []byte) (int, error) { c.n += int64(len(b)); return len(b), nil }

// checkImage runs everything a caller may run on untrusted bytes: Open,
// Map, and both conversions. Errors are fine; panics, rejections that are
// not *RejectError where validation failed, and outputs whose size differs
// from the plan are not.
func checkImage(t *testing.T, data []byte) {
	ctx := context.Background()
	img, err := Open(bytes.NewReader(data), int64(len(data)), OpenOptions{MaxVirtualSize: fuzzMaxVirtual})
	if err != nil {
		return
	}
	if _, err := img.Map(ctx); err != nil {
		if AsReject(err) == nil {
			t.Fatalf("Map returned a non-rejection error: %v", err)
		}
		return
	}
	var raw bytes.Buffer
	for _, to := range []Format{FormatRaw, FormatQCOW2} {
		p, err := img.Plan(ctx, Options{To: to, ClusterSize: 4096, Concurrency: 2})
		if err != nil {
			return
		}
		var w io.Writer = &countingWriter{}
		if to == FormatRaw {
			w = &raw
		}
		if err := p.Write(ctx, w); err != nil {
			return
		}
		n := int64(raw.Len())
		if c, ok := w.(*countingWriter); ok {
			n = c.n
		}
		if n != p.Size() {
			t.Fatalf("%s output is %d bytes, plan said %d", to, n, p.Size())
		}
	}
}

// FuzzOpen feeds whole files to the engine. Seeds: testdata/fuzz/FuzzOpen
// (heads of the hostile corpus, see test/hostile) and small valid images.
func FuzzOpen(f *testing.F) {
	for _, seed := range validSeeds(f) {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) { checkImage(t, data) })
}

// FuzzQCOW2Header checks that header parsing never panics and that what it
// accepts satisfies the invariants the reader relies on.
func FuzzQCOW2Header(f *testing.F) {
	for _, seed := range validSeeds(f) {
		f.Add(seed[:min(len(seed), 1024)], int64(len(seed)))
	}
	f.Fuzz(func(t *testing.T, head []byte, fileSize int64) {
		if fileSize < int64(len(head)) {
			fileSize = int64(len(head))
		}
		h, err := parseQCOW2Header(head, fileSize, fuzzMaxVirtual)
		if err != nil {
			if AsReject(err) == nil {
				t.Fatalf("non-rejection error: %v", err)
			}
			return
		}
		switch {
		case h.clusterBits < minClusterBits || h.clusterBits > maxClusterBits:
			t.Fatalf("accepted cluster_bits %d", h.clusterBits)
		case h.size == 0 || h.size > fuzzMaxVirtual:
			t.Fatalf("accepted virtual size %d", h.size)
		case uint64(h.l1Size) < h.l1Needed() || uint64(h.l1Size)*8 > maxL1Bytes:
			t.Fatalf("accepted l1_size %d for size %d", h.l1Size, h.size)
		case h.l1Offset+h.l1Needed()*8 > uint64(fileSize):
			t.Fatalf("accepted an L1 table past the end of the file")
		}
	})
}

// FuzzL2Table builds a well-formed 512-byte-cluster qcow2 around a fuzzed
// L2 table and fuzzed cluster contents, so every L2 entry shape (data,
// zero, compressed with any descriptor) reaches the reader.
func FuzzL2Table(f *testing.F) {
	l2 := make([]byte, 512)
	binary.BigEndian.PutUint64(l2[0:], entryCopied|4*512) // data cluster
	binary.BigEndian.PutUint64(l2[8:], entryZero)         // zero cluster
	// A compressed cluster at 5*512, two sectors.
	binary.BigEndian.PutUint64(l2[16:], entryCompressed|1<<(62-(9-8))|5*512)
	comp := compressCluster(f, bytes.Repeat([]byte("ab"), 256), false)
	payload := append(bytes.Repeat([]byte{0x42}, 512), comp...)
	f.Add(l2, payload, false)
	f.Add(l2, append(bytes.Repeat([]byte{0x42}, 512), compressCluster(f, make([]byte, 512), true)...), true)
	f.Fuzz(func(t *testing.T, l2 []byte, payload []byte, zstd bool) {
		if len(l2) > 512 || len(payload) > 64<<10 {
			return
		}
		checkImage(t, tinyQCOW2(l2, payload, zstd))
	})
}

// tinyQCOW2 lays out a 32 KiB-virtual image with 512-byte clusters:
// header | L1 | L2 (given) | refcount table | payload from cluster 4 on.
func tinyQCOW2(l2, payload []byte, zstd bool) []byte {
	const cs = 512
	img := make([]byte, 4*cs, 4*cs+len(payload))
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
	return append(img, payload...)
}

// compressCluster compresses one cluster as QEMU stores it.
func compressCluster(tb testing.TB, cluster []byte, useZstd bool) []byte {
	var buf bytes.Buffer
	if useZstd {
		enc, err := zstd.NewWriter(nil)
		if err != nil {
			tb.Fatal(err)
		}
		return enc.EncodeAll(cluster, nil)
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
