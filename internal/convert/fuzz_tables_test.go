package convert

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/klauspost/compress/flate"
	"github.com/klauspost/compress/zstd"

	"github.com/imagepipe/imagepipe/internal/reject"

	"github.com/imagepipe/imagepipe/internal/need"
)

// reusedCluster is the fuzz targets' own account of the sharing rule,
// written independently of Verify: it walks the active tables of an image
// Open accepted and says how a host cluster is reached twice, or "". The
// header cluster, the L1 table, the refcount table, each L2 table and each
// data cluster must be distinct clusters; compressed clusters must start
// at distinct bytes, none of them inside one of those clusters, and each
// must decode from the bytes before the next start.
func reusedCluster(data []byte, info Info) string {
	be := binary.BigEndian
	bits := be.Uint32(data[20:])
	cs := int64(1) << bits
	l1 := int64(be.Uint64(data[40:]))
	rt, rtClusters := int64(be.Uint64(data[48:])), int64(be.Uint32(data[56:]))
	guestClusters := (info.VirtualSize + cs - 1) / cs
	perTable := cs / 8
	tables := (guestClusters + perTable - 1) / perTable

	owner := map[int64]string{}
	var why string
	own := func(off int64, what string) {
		c := off / cs
		if prev, ok := owner[c]; ok && why == "" {
			why = fmt.Sprintf("host cluster %#x is %s and %s", c*cs, prev, what)
		}
		owner[c] = what
	}
	own(0, "the header")
	for off := l1 / cs * cs; off < l1+tables*8; off += cs {
		own(off, "the L1 table")
	}
	for i := range rtClusters {
		if rt+i*cs < int64(len(data)) {
			own(rt+i*cs, "the refcount table")
		}
	}
	type compressed struct{ guest, length int64 }
	starts := map[int64]compressed{} // by host offset
	for i := range tables {
		l2 := int64(be.Uint64(data[l1+8*i:]) & l1OffsetMask)
		if l2 == 0 {
			continue
		}
		own(l2, fmt.Sprintf("the L2 table of L1 entry %d", i))
		table := make([]byte, cs)
		copy(table, data[l2:])
		for j := range min(perTable, guestClusters-i*perTable) {
			e := be.Uint64(table[8*j:])
			guest := (i*perTable + j) * cs
			switch {
			case e&entryCompressed != 0:
				host := int64(e & (1<<(62-(bits-8)) - 1))
				if c, ok := starts[host]; ok && why == "" {
					why = fmt.Sprintf("guest offsets %#x and %#x are compressed at %#x", c.guest, guest, host)
				}
				sectors := int64(e>>(62-(bits-8))) & (1<<(bits-8) - 1)
				starts[host] = compressed{guest, (sectors+1)*512 - host%512}
			case e&entryZero != 0 || e&l2OffsetMask == 0:
			default:
				own(int64(e&l2OffsetMask), fmt.Sprintf("the data of guest offset %#x", guest))
			}
		}
	}
	for host, c := range starts {
		if what, ok := owner[host/cs]; ok && why == "" {
			why = fmt.Sprintf("guest offset %#x is compressed at %#x, inside %s", c.guest, host, what)
		}
	}
	if why != "" {
		return why
	}
	// Each stream must decode from the bytes before the next start.
	hosts := slices.Sorted(maps.Keys(starts))
	for i, host := range hosts {
		e := starts[host]
		end := host + e.length
		if i+1 < len(hosts) {
			end = min(end, hosts[i+1])
		}
		if !decodes(data, host, end, cs, info.CompressionType) {
			return fmt.Sprintf("guest offset %#x is accepted, but its stream at %#x does not decode from the %d bytes before %#x", e.guest, host, end-host, end)
		}
	}
	return ""
}

// decodes reports whether one cluster of cs bytes decodes from data[host:end]
// (zeros past the end of data, as QEMU reads them).
func decodes(data []byte, host, end, cs int64, codec string) bool {
	in := make([]byte, end-host)
	if host < int64(len(data)) {
		copy(in, data[host:min(end, int64(len(data)))])
	}
	var r io.Reader
	if codec == "zstd" {
		d, err := zstd.NewReader(bytes.NewReader(in), zstd.WithDecoderConcurrency(1))
		if err != nil {
			return false
		}
		defer d.Close()
		r = d
	} else {
		r = flate.NewReader(bytes.NewReader(in))
	}
	_, err := io.ReadFull(r, make([]byte, cs))
	return err == nil
}

// The FuzzTableSharing layout: 512-byte clusters, four L2 tables' worth of
// disk (128 KiB), the header, L1 table, refcount table, then four clusters
// for L2 tables, then the payload.
const (
	shareBits     = 9
	shareCS       = 1 << shareBits
	shareTables   = 4
	sharePerTable = shareCS / 8
	shareTableAt  = 3 // first cluster of the L2 table area
	sharePayload  = shareTableAt + shareTables
)

// shareStreams caches the compressed clusters payload recipes use: one per
// codec and fill byte.
var shareStreams sync.Map // [2]byte{codec, fill} → []byte

func shareStream(useZstd bool, fill byte) []byte {
	key := [2]byte{0, fill}
	if useZstd {
		key[0] = 1
	}
	if s, ok := shareStreams.Load(key); ok {
		return s.([]byte)
	}
	cluster := bytes.Repeat([]byte{fill, fill ^ 0x5a, 'q'}, shareCS)[:shareCS]
	s := compressCluster(nil, cluster, useZstd)
	shareStreams.Store(key, s)
	return s
}

// sharingImage builds the FuzzTableSharing image. Everything is encoded
// compactly, so that nearly every input is a plausible image, pointing two
// entries at the same place is a one-byte mutation, and inputs stay short:
// Go's minimiser takes time quadratic in an input's length.
//
//   - l1: one byte per L1 entry: 0 is unallocated, n any other value the
//     L2 table at cluster n modulo the file's clusters;
//   - l2: four bytes per L2 entry that is set (the others are unallocated):
//     the entry's index in the table area (a byte: table·64 + entry, modulo
//     256), its kind (low two bits: 0 unallocated, 1 data, 2 zero, 3
//     compressed; bit 2: one more sector for a compressed descriptor) and a
//     little-endian uint16: the data cluster (modulo the clusters) or the
//     compressed byte offset (modulo the file size);
//   - recipe: the payload from cluster 7 on, two bytes per item: kind (low
//     two bits: 0 a cluster filled with the value, 1 a compressed cluster
//     of a pattern of the value, byte-packed after the previous item, 2 as
//     many zero bytes as the value, 3 below 128 the value as a single
//     byte, from 128 on a compressed piece that produces nothing: an empty
//     stored deflate block or a zstd skippable frame) and the value.
func sharingImage(l1, l2, recipe []byte, useZstd bool) []byte {
	q := newQCOWBuilder(shareBits, shareTables*sharePerTable*shareCS, useZstd)
	for len(q.b) < sharePayload*shareCS {
		q.alloc(1)
	}
	for k := 0; k+2 <= len(recipe); k += 2 {
		v := recipe[k+1]
		switch recipe[k] & 3 {
		case 0:
			q.b = append(q.b, bytes.Repeat([]byte{v}, shareCS)...)
		case 1:
			q.b = append(q.b, shareStream(useZstd, v)...)
		case 2:
			q.b = append(q.b, make([]byte, v)...)
		case 3:
			if v < 128 {
				q.b = append(q.b, v)
			} else {
				q.b = append(q.b, emptyPrefix(useZstd)...)
			}
		}
	}
	size := int64(len(q.b))
	clusters := (size + shareCS - 1) / shareCS
	for i := range min(len(l1), shareTables) {
		if l1[i] != 0 {
			q.setL1(int64(i), int64(l1[i])%clusters*shareCS)
		}
	}
	for k := 0; k+4 <= len(l2); k += 4 {
		n := int64(l2[k]) % (shareTables * sharePerTable)
		v := int64(l2[k+2]) | int64(l2[k+3])<<8
		var e uint64
		switch l2[k+1] & 3 {
		case 1:
			e = q.data(v % clusters * shareCS)
		case 2:
			e = entryZero
		case 3:
			e = entryCompressed | uint64(v%size)
			if l2[k+1]&4 != 0 {
				e |= 1 << (62 - (shareBits - 8))
			}
		}
		q.put(shareTableAt*shareCS+8*n, e)
	}
	return q.bytes()
}

// FuzzTableSharing fuzzes where the active tables point: L1 entries at any
// cluster, L2 entries at any cluster or byte, so that tables, data and
// compressed streams land on each other. Accepted images must reach no host
// cluster twice and stay within the work and output bounds (checkImage).
// Seeds: testdata/fuzz/FuzzTableSharing, valid layouts and sharing ones.
func FuzzTableSharing(f *testing.F) {
	for _, s := range sharingSeeds(f) {
		f.Add(s.l1, s.l2, s.recipe, s.zstd)
	}
	f.Fuzz(func(t *testing.T, l1, l2, recipe []byte, useZstd bool) {
		if img, ok := sharingInput(l1, l2, recipe, useZstd); ok {
			fuzzCheck(t, img)
		}
	})
}

// sharingInput is the image of a FuzzTableSharing input, false for an
// input too long to fuzz.
func sharingInput(l1, l2, recipe []byte, useZstd bool) ([]byte, bool) {
	if len(l1) > shareTables || len(l2) > 4*48 || len(recipe) > 2*32 {
		return nil, false
	}
	return sharingImage(l1, l2, recipe, useZstd), true
}

type sharingSeed struct {
	l1, l2, recipe []byte
	zstd           bool
	// want is the rejection, "" for the valid image; detail a piece of
	// its text that tells the case from others of the same reason.
	want   reject.Reason
	detail string
}

// sharingSeeds are, for each codec, a valid image (a data cluster, two
// byte-packed compressed clusters and a zero cluster behind every table)
// and, from it, the sharing the engine must refuse: a table twice, a data
// cluster twice, a compressed start twice, a data cluster on a table, the
// next start inside a stream, a table on the refcount table, a compressed
// start inside a data cluster, and descriptors on a chain of empty
// prefixes of one stream.
func sharingSeeds(tb testing.TB) []sharingSeed {
	var seeds []sharingSeed
	for _, useZstd := range []bool{false, true} {
		var recipe, l2 []byte
		end := sharePayload * shareCS // where the next payload item goes
		entry := func(index int, kind byte, v int) { l2 = append(l2, byte(index), kind, byte(v), byte(v>>8)) }
		for table := range shareTables {
			first := table * sharePerTable
			// A data cluster of its own.
			for pad := (shareCS - end%shareCS) % shareCS; pad > 0; {
				n := min(pad, 255)
				recipe = append(recipe, 2, byte(n))
				pad -= n
				end += n
			}
			fill := byte(table*16 + 1)
			recipe = append(recipe, 0, fill)
			entry(first, 1, end/shareCS)
			end += shareCS
			// Two compressed clusters, byte-packed.
			for i := range 2 {
				stream := shareStream(useZstd, fill+byte(i))
				kind := byte(3)
				if end/512 != (end+len(stream)-1)/512 {
					kind |= 4
				}
				recipe = append(recipe, 1, fill+byte(i))
				entry(first+1+i, kind, end)
				end += len(stream)
			}
			entry(first+3, 2, 0) // a zero cluster
		}
		l1 := []byte{shareTableAt, shareTableAt + 1, shareTableAt + 2, shareTableAt + 3}
		seeds = append(seeds, sharingSeed{l1: l1, l2: l2, recipe: recipe, zstd: useZstd})
		// The same, with the sharing the rule forbids. Entry items: 0 is
		// the first table's data cluster, 1 and 2 its compressed clusters,
		// 4 the second table's data cluster.
		clone := func(want reject.Reason, detail string, edit func(l1, l2 []byte)) {
			a, b := bytes.Clone(l1), bytes.Clone(l2)
			edit(a, b)
			seeds = append(seeds, sharingSeed{a, b, recipe, useZstd, want, detail})
		}
		// One table twice.
		clone(reject.SharedL2Table, "already used as an L2 table", func(l1, _ []byte) { l1[1] = l1[0] })
		// One data cluster twice.
		clone(reject.SharedCluster, "already used as a data cluster", func(_, l2 []byte) { copy(l2[4*4+1:4*4+4], l2[1:4]) })
		// One compressed start twice.
		clone(reject.SharedCluster, "two compressed clusters start", func(_, l2 []byte) { copy(l2[2*4+1:2*4+4], l2[5:8]) })
		// Data on a table.
		clone(reject.MetadataOverlap, "already used as a data cluster", func(_, l2 []byte) { l2[1], l2[2], l2[3] = 1, shareTableAt+2, 0 })
		// The next start inside a stream.
		clone(reject.SharedCluster, "runs into the compressed cluster", func(_, l2 []byte) {
			v := int(l2[6]) | int(l2[7])<<8 + 1
			l2[10], l2[11] = byte(v), byte(v>>8)
		})
		// A table on the refcount table (cluster 2).
		clone(reject.MetadataOverlap, "qcow2 metadata", func(l1, _ []byte) { l1[1] = 2 })
		// A compressed start inside the first data cluster.
		clone(reject.SharedCluster, "lies on a data cluster", func(_, l2 []byte) {
			v := (int(l2[2])|int(l2[3])<<8)*shareCS + 1
			l2[5], l2[6], l2[7] = 3, byte(v), byte(v>>8)
		})
		// Three descriptors on a chain of empty prefixes before one stream:
		// each alone decodes the same cluster.
		start := sharePayload * shareCS
		p := len(emptyPrefix(useZstd))
		seeds = append(seeds, sharingSeed{
			l1:     []byte{shareTableAt},
			l2:     []byte{0, 3, byte(start), byte(start >> 8), 1, 3, byte(start + p), byte((start + p) >> 8), 2, 3, byte(start + 2*p), byte((start + 2*p) >> 8)},
			recipe: []byte{3, 128, 3, 128, 1, 7},
			zstd:   useZstd,
			want:   reject.SharedCluster,
			detail: "runs into the compressed cluster",
		})
	}
	return seeds
}

// TestWriteFuzzSeeds writes the seeds of FuzzTableSharing and FuzzL2Table
// to testdata/fuzz, in the format go test -fuzz reads. It only runs with
// IMAGEPIPE_WRITE_SEEDS=1, since it writes into the source tree.
func TestWriteFuzzSeeds(t *testing.T) {
	need.OptIn(t, "IMAGEPIPE_WRITE_SEEDS", "rewrite testdata/fuzz/FuzzTableSharing and FuzzL2Table")
	write := func(target string, i int, values ...any) {
		dir := filepath.Join("testdata", "fuzz", target)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		seed := "go test fuzz v1\n"
		for _, v := range values {
			switch v := v.(type) {
			case []byte:
				seed += fmt.Sprintf("[]byte(%q)\n", v)
			case bool:
				seed += fmt.Sprintf("bool(%v)\n", v)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%02d", i)), []byte(seed), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for i, s := range sharingSeeds(t) {
		write("FuzzTableSharing", i, s.l1, s.l2, s.recipe, s.zstd)
	}
	for i, s := range l2Seeds(t) {
		write("FuzzL2Table", i, s.l2, s.comp, s.zstd)
	}
}

// TestTableSharingSeeds checks the seeds mean what they say: the first of
// each codec is accepted, each other one rejected for its own sharing; and
// that checkImage holds on all of them.
func TestTableSharingSeeds(t *testing.T) {
	for i, s := range sharingSeeds(t) {
		img, _, err := openBytes(t, sharingImage(s.l1, s.l2, s.recipe, s.zstd), OpenOptions{})
		if err == nil {
			_, err = img.Verify(t.Context())
		}
		switch re := reject.As(err); {
		case s.want == "" && err != nil:
			t.Errorf("seed %d: %v", i, err)
		case s.want != "" && (re == nil || re.Reason != s.want || !strings.Contains(re.Detail, s.detail)):
			t.Errorf("seed %d: %v, want %s saying %q", i, err, s.want, s.detail)
		}
		checkImage(t, sharingImage(s.l1, s.l2, s.recipe, s.zstd))
	}
}
