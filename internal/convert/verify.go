package convert

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"golang.org/x/sync/errgroup"

	"github.com/imagepipe/imagepipe/internal/reject"
)

// Maximum compression ratios: the most guest bytes one byte of a valid
// stream can produce. Deflate spends at least 2 bits on a match of at most
// 258 bytes; a zstd block is at least 4 bytes (3 of header) and produces at
// most 128 KiB. A compressed cluster that consumed fewer than
// clusterSize/ratio bytes is rejected, whatever the decoder accepts.
const (
	maxRatioZlib = 258 * 8 / 2
	maxRatioZstd = (128 << 10) / 4
)

// maxExpansion bounds the guest data of all compressed clusters together:
// at most this many bytes per byte of the file, deflate's own limit, so
// that a zstd image cannot claim more than a zlib one could.
const maxExpansion = maxRatioZlib

// maxRatio is the maximum compression ratio of the image's codec.
func (h *qcowHeader) maxRatio() int64 {
	if h.compression == compressionZstd {
		return maxRatioZstd
	}
	return maxRatioZlib
}

// verdict is the cached outcome of Verify, and of its first stage, the
// walk over the tables.
type verdict struct {
	mu      sync.Mutex
	walked  bool // walkSum and walkErr are known
	walkSum MapSummary
	walkErr error
	done    bool // sum and err are known
	sum     MapSummary
	err     error
}

// Verify judges the whole image and returns its allocation map: it walks
// every L1 and L2 entry the virtual size reaches, checks that no host
// cluster is used twice (docs/security.md, "Work bounded by the file"),
// and decompresses every compressed cluster once. An image without
// compressed clusters needs only the walk over its tables; no guest data
// is read.
//
// Verify is the verdict every command shares: inspect, convert and import
// reach the same one for the same bytes. Plan runs it first; WriteFile runs
// its walk first and decompresses while it writes, and when that finds a
// fault it returns Verify's rejection. The outcome is remembered, so
// Verify runs once per Image. The returned error is a *reject.Error when
// the image breaks the validation contract.
func (img *Image) Verify(ctx context.Context) (MapSummary, error) {
	v := &img.verdict
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.done {
		return v.sum, v.err
	}
	sum, err := img.walkLocked(ctx)
	if q, ok := img.src.(*qcow2Source); ok && err == nil && sum.CompressedClusters > 0 {
		err = q.verifyCompressed(ctx, img.info.VirtualSize)
	}
	if err != nil && ctx.Err() != nil {
		return MapSummary{}, err // interrupted: no verdict yet
	}
	if err != nil {
		sum = MapSummary{}
	}
	v.done, v.sum, v.err = true, sum, err
	return sum, err
}

// walk runs Verify's first stage, every check but decompression.
func (img *Image) walk(ctx context.Context) (MapSummary, error) {
	img.verdict.mu.Lock()
	defer img.verdict.mu.Unlock()
	return img.walkLocked(ctx)
}

func (img *Image) walkLocked(ctx context.Context) (MapSummary, error) {
	v := &img.verdict
	if v.walked {
		return v.walkSum, v.walkErr
	}
	var sum MapSummary
	var err error
	if q, ok := img.src.(*qcow2Source); ok {
		sum, err = q.walk(ctx, img.info.VirtualSize)
	} else {
		sum, err = img.mapExtents(ctx)
	}
	if err != nil && ctx.Err() != nil {
		return MapSummary{}, err
	}
	v.walked, v.walkSum, v.walkErr = true, sum, err
	return sum, err
}

// mapExtents sums the allocation map of a source that needs no table
// checks (raw).
func (img *Image) mapExtents(ctx context.Context) (MapSummary, error) {
	var sum MapSummary
	step := max(img.src.alignment(), 1<<30)
	for off := int64(0); off < img.info.VirtualSize; off += step {
		n := min(step, img.info.VirtualSize-off)
		err := img.src.extents(ctx, off, n, func(e extent) error {
			if e.kind != extentZero {
				sum.AllocatedBytes += e.length
			}
			return nil
		})
		if err != nil {
			return MapSummary{}, err
		}
	}
	return sum, nil
}

// Host cluster uses, two bits per cluster in a hostMap.
const (
	useFree     = 0
	useMetadata = 1 // header, L1 table, refcount table
	useL2       = 2
	useData     = 3
)

var useNames = [...]string{"", "qcow2 metadata (header, L1 or refcount table)", "an L2 table", "a data cluster"}

// hostMap records what each host cluster of a qcow2 file is used for by the
// active tables: two bits per cluster of the file.
type hostMap struct {
	words []uint64
	bits  uint32 // cluster_bits
	n     int64  // clusters in the file
}

func newHostMap(fileSize int64, clusterBits uint32) *hostMap {
	n := (fileSize + 1<<clusterBits - 1) >> clusterBits
	return &hostMap{words: make([]uint64, (n+31)/32), bits: clusterBits, n: n}
}

func (m *hostMap) get(c int64) int {
	if c < 0 || c >= m.n {
		return useFree
	}
	return int(m.words[c/32]>>(2*(c%32))) & 3
}

// claim records that cluster c is used as use and returns its previous use.
// Clusters past the end of the file are not recorded.
func (m *hostMap) claim(c int64, use int) int {
	old := m.get(c)
	if old == useFree && c < m.n {
		m.words[c/32] |= uint64(use) << (2 * (c % 32))
	}
	return old
}

// claimRange claims every cluster touching [off, off+n) and reports the
// first one already in use.
func (m *hostMap) claimRange(off, n int64, use int) (cluster int64, old int) {
	for c := off >> m.bits; c <= (off+n-1)>>m.bits; c++ {
		if old := m.claim(c, use); old != useFree {
			return c, old
		}
	}
	return 0, useFree
}

// startSet holds the host offsets at which compressed clusters start. A
// compressed cluster may read its data only up to the next start (or the
// end of its descriptor, whichever is first), so streams never share a
// byte. It keeps a sorted list of offsets, 8 bytes each, until that would
// be larger than one bit per byte of the file, and then that bitmap
// instead: at most min(8·count, fileSize/8) bytes.
type startSet struct {
	list     []int64
	bits     bitmap // one bit per byte of the file, once list grew too long
	fileSize int64
	dup      int64 // a start added twice, or -1
}

func newStartSet(fileSize int64) *startSet { return &startSet{fileSize: fileSize, dup: -1} }

func (s *startSet) add(off int64) {
	if s.bits == nil && int64(len(s.list)+1)*64 > s.fileSize {
		s.bits = newBitmap(s.fileSize)
		for _, o := range s.list {
			s.setBit(o)
		}
		s.list = nil
	}
	if s.bits != nil {
		s.setBit(off)
		return
	}
	s.list = append(s.list, off)
}

func (s *startSet) setBit(off int64) {
	if s.bits.has(off) && s.dup < 0 {
		s.dup = off
	}
	s.bits.set(off)
}

// finish sorts the list and returns a start that was added twice, or -1.
func (s *startSet) finish() int64 {
	slices.Sort(s.list)
	for i := 1; i < len(s.list) && s.dup < 0; i++ {
		if s.list[i] == s.list[i-1] {
			s.dup = s.list[i]
		}
	}
	return s.dup
}

// next returns the first start after off, or limit when there is none
// before limit.
func (s *startSet) next(off, limit int64) int64 {
	if s.bits == nil {
		i, _ := slices.BinarySearch(s.list, off+1)
		if i < len(s.list) {
			return min(s.list[i], limit)
		}
		return limit
	}
	for p := off + 1; p < min(limit, s.fileSize); p++ {
		if p%64 == 0 && s.bits[p/64] == 0 {
			p += 63
			continue
		}
		if s.bits.has(p) {
			return p
		}
	}
	return limit
}

// walk checks the active tables: every entry, and that no host cluster is
// used twice. It records the compressed clusters' starts and the clusters'
// uses, which decompress checks against. See Image.Verify.
func (s *qcow2Source) walk(ctx context.Context, vsize int64) (MapSummary, error) {
	h := s.h
	cs := h.clusterSize()
	m := newHostMap(s.fileSize, h.clusterBits)
	starts := newStartSet(s.fileSize)
	var sum MapSummary

	// The structures the header names, as far as they are read or sized.
	fixed := []struct {
		what   string
		off, n int64
	}{
		{"header", 0, cs},
		{"L1 table", int64(h.l1Offset), int64(h.l1Needed()) * 8},
		{"refcount table", int64(h.refTableOffset), int64(h.refTableCluster) * cs},
	}
	for _, f := range fixed {
		if c, old := m.claimRange(f.off, f.n, useMetadata); old != useFree {
			return MapSummary{}, reject.New(reject.MetadataOverlap, "the %s at %#x overlaps %s at host cluster %#x", f.what, f.off, useNames[old], c<<h.clusterBits)
		}
	}

	entries := h.l2Entries()
	raw := make([]byte, cs)
	for i, l2 := range s.l1 {
		if err := ctx.Err(); err != nil {
			return MapSummary{}, err
		}
		if l2 == 0 {
			continue
		}
		if old := m.claim(int64(l2)>>h.clusterBits, useL2); old != useFree {
			reason := reject.MetadataOverlap
			if old == useL2 {
				reason = reject.SharedL2Table
			}
			return MapSummary{}, reject.New(reason, "L1 entry %d points to an L2 table at %#x, which is already used as %s", i, l2, useNames[old])
		}
		if err := readFull(s.r, raw, int64(l2)); err != nil {
			return MapSummary{}, err
		}
		first := int64(i) * entries // guest cluster of entry 0
		used := min(entries, (vsize+cs-1)/cs-first)
		for j := range used {
			e := binary.BigEndian.Uint64(raw[j*8:])
			guest := (first + j) * cs
			if err := s.checkL2Entry(uint64(first+j), e); err != nil {
				return MapSummary{}, err
			}
			length := min(cs, vsize-guest)
			switch {
			case e&entryCompressed != 0:
				host, _ := h.compressedDescriptor(e)
				starts.add(host)
				sum.AllocatedBytes += length
				sum.CompressedClusters++
			case e&entryZero != 0, e&l2OffsetMask == 0:
			default:
				off := e & l2OffsetMask
				if old := m.claim(int64(off)>>h.clusterBits, useData); old != useFree {
					reason := reject.MetadataOverlap
					if old == useData {
						reason = reject.SharedCluster
					}
					return MapSummary{}, reject.New(reason, "the data cluster for guest offset %#x is at %#x, which is already used as %s", guest, off, useNames[old])
				}
				sum.AllocatedBytes += length
			}
		}
	}
	if dup := starts.finish(); dup >= 0 {
		return MapSummary{}, reject.New(reject.SharedCluster, "two compressed clusters start at host offset %#x", dup)
	}
	if claimed := sum.CompressedClusters * cs; claimed/maxExpansion > s.fileSize {
		return MapSummary{}, reject.New(reject.CompressionRatio, "%d compressed clusters claim %d bytes of guest data from a %d-byte file, more than %d per byte of file (deflate's limit)", sum.CompressedClusters, claimed, s.fileSize, maxExpansion)
	}
	s.starts, s.uses = starts, m
	return sum, nil
}

// verifyCompressed decompresses every compressed cluster once, in
// parallel. Of several faults it reports the one at the lowest guest
// offset, so the verdict does not depend on scheduling.
func (s *qcow2Source) verifyCompressed(ctx context.Context, vsize int64) error {
	h := s.h
	cs := h.clusterSize()
	batch := max(cs, batchSize)
	workers := min(int64(verifyConcurrency()), ceilDiv(vsize, batch))
	var next atomic.Int64
	var mu sync.Mutex
	badAt, badErr := int64(math.MaxInt64), error(nil)
	fail := func(at int64, err error) {
		mu.Lock()
		defer mu.Unlock()
		if at < badAt {
			badAt, badErr = at, err
		}
	}
	failedBefore := func(at int64) bool {
		mu.Lock()
		defer mu.Unlock()
		return badAt < at
	}
	var g errgroup.Group
	for range workers {
		g.Go(func() error {
			sc := getScratch()
			defer sc.close()
			for {
				off := next.Add(batch) - batch
				if off >= vsize || failedBefore(off) {
					return nil
				}
				err := s.extents(ctx, off, min(batch, vsize-off), func(e extent) error {
					if e.kind != extentCompressed {
						return nil
					}
					return s.decompress(e, sc.clusterBuf(cs), sc)
				})
				if err != nil {
					if ctx.Err() != nil {
						return ctx.Err()
					}
					fail(off, err)
					return nil
				}
			}
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	if badErr != nil {
		return badErr
	}
	return ctx.Err()
}

// claimRangeReadOnly reports the first cluster touching [off, off+n) that
// the tables use, without recording anything; it is safe for concurrent use
// once the walk is over.
func (m *hostMap) claimRangeReadOnly(off, n int64) (cluster int64, old int) {
	for c := off >> m.bits; c <= (off+n-1)>>m.bits; c++ {
		if old := m.get(c); old != useFree {
			return c, old
		}
	}
	return 0, useFree
}

// errNotVerified is returned when compressed data is read before the walk.
var errNotVerified = errors.New("reading compressed clusters of an image whose tables were not checked")

// verifyConcurrency is the number of parallel decompressors Verify uses.
func verifyConcurrency() int { return max(2, runtime.GOMAXPROCS(0)) }

// compressedEnd is where the data of compressed cluster e ends: at the end
// of its descriptor, or at the start of the next compressed cluster when
// that comes first. Only the walk knows the starts.
func (s *qcow2Source) compressedEnd(e extent) int64 {
	return s.starts.next(e.host, e.host+e.clen)
}

// checkCompressedRange refuses compressed data, [e.host, end), that lies on
// a cluster the tables use otherwise.
func (s *qcow2Source) checkCompressedRange(e extent, end int64) error {
	c, old := s.uses.claimRangeReadOnly(e.host, end-e.host)
	if old == useFree {
		return nil
	}
	reason := reject.MetadataOverlap
	if old == useData {
		reason = reject.SharedCluster
	}
	return reject.New(reason, "the compressed cluster at guest offset %#x (%d bytes at %#x) lies on %s at host cluster %#x", s.clusterStart(e), end-e.host, e.host, useNames[old], c<<s.h.clusterBits)
}
