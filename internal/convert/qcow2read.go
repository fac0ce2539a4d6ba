package convert

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"sync"

	"github.com/klauspost/compress/flate"
	"github.com/klauspost/compress/zstd"

	"github.com/imagepipe/imagepipe/internal/reject"
)

// l2CacheBytes bounds the memory held by cached L2 tables.
const l2CacheBytes = 8 << 20

// qcow2Source reads guest data through a qcow2 image's L1/L2 tables.
type qcow2Source struct {
	r        io.ReaderAt
	fileSize int64
	h        *qcowHeader
	l1       []uint64 // the L1 entries the virtual size needs, validated

	mu      sync.Mutex
	l2      map[uint64][]uint64 // L1 index → validated L2 entries
	l2Order []uint64            // insertion order, for eviction
	l2Max   int

	// starts holds where compressed clusters start and uses what each host
	// cluster is used for; set by the walk, which must run before
	// compressed data is read (see compressedEnd, checkCompressedRange).
	starts *startSet
	uses   *hostMap
}

func newQCOW2Source(r io.ReaderAt, fileSize int64, h *qcowHeader) (*qcow2Source, error) {
	n := h.l1Needed()
	raw := make([]byte, n*8)
	if err := readFull(r, raw, int64(h.l1Offset)); err != nil {
		return nil, err
	}
	s := &qcow2Source{
		r: r, fileSize: fileSize, h: h,
		l1:    make([]uint64, n),
		l2:    make(map[uint64][]uint64),
		l2Max: int(max(4, l2CacheBytes/h.clusterSize())),
	}
	cs := uint64(h.clusterSize())
	for i := range s.l1 {
		e := binary.BigEndian.Uint64(raw[i*8:])
		off := e & l1OffsetMask
		switch {
		case e&l1Reserved != 0:
			return nil, reject.New(reject.L1Table, "L1 entry %d (%#x) sets reserved bits", i, e)
		case off%cs != 0:
			return nil, reject.New(reject.L2Table, "L1 entry %d points to an L2 table at %#x, which is not cluster-aligned", i, off)
		case off != 0 && off+cs > uint64(fileSize):
			return nil, reject.New(reject.L2Table, "L1 entry %d points to an L2 table at %#x, past the end of the %d-byte file", i, off, fileSize)
		}
		s.l1[i] = off
	}
	return s, nil
}

func (s *qcow2Source) alignment() int64 { return s.h.clusterSize() }

// table returns the validated L2 table for L1 index i, or nil when the
// whole range is unallocated.
func (s *qcow2Source) table(i uint64) ([]uint64, error) {
	off := s.l1[i]
	if off == 0 {
		return nil, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if t, ok := s.l2[i]; ok {
		return t, nil
	}
	t, err := s.loadTable(i, off)
	if err != nil {
		return nil, err
	}
	if len(s.l2Order) >= s.l2Max {
		delete(s.l2, s.l2Order[0])
		s.l2Order = s.l2Order[1:]
	}
	s.l2[i] = t
	s.l2Order = append(s.l2Order, i)
	return t, nil
}

// loadTable reads and validates the L2 table at off. Entries past the
// virtual size are never used and not checked.
func (s *qcow2Source) loadTable(i, off uint64) ([]uint64, error) {
	h := s.h
	raw := make([]byte, h.clusterSize())
	if err := readFull(s.r, raw, int64(off)); err != nil {
		return nil, err
	}
	entries := uint64(h.l2Entries())
	first := i * entries // guest cluster index of entry 0
	used := min(entries, (h.size+uint64(h.clusterSize())-1)>>h.clusterBits-first)
	t := make([]uint64, entries)
	for j := range used {
		e := binary.BigEndian.Uint64(raw[j*8:])
		if err := s.checkL2Entry(first+j, e); err != nil {
			return nil, err
		}
		t[j] = e
	}
	return t, nil
}

// compressedDescriptor splits a compressed cluster descriptor into the
// host offset and the number of bytes that hold the compressed data.
func (h *qcowHeader) compressedDescriptor(e uint64) (host, length int64) {
	x := 62 - (h.clusterBits - 8)
	host = int64(e & (1<<x - 1))
	sectors := int64((e>>x)&(1<<(h.clusterBits-8)-1)) + 1
	return host, sectors*512 - host&511
}

func (s *qcow2Source) checkL2Entry(cluster, e uint64) error {
	h := s.h
	guest := cluster << h.clusterBits
	if e&entryCompressed != 0 {
		host, n := h.compressedDescriptor(e)
		if host >= s.fileSize || host < int64(h.clusterSize()) {
			return reject.New(reject.CompressedCluster, "the compressed cluster at guest offset %#x points to %#x, outside the %d-byte file", guest, host, s.fileSize)
		}
		// The last compressed cluster may end inside its final sector
		// at the end of the file, never further.
		if host+n > s.fileSize+512 {
			return reject.New(reject.CompressedCluster, "the compressed cluster at guest offset %#x (%d bytes at %#x) runs past the end of the file", guest, n, host)
		}
		return nil
	}
	off := e & l2OffsetMask
	if e&entryZero != 0 {
		if h.version < 3 {
			return reject.New(reject.L2Table, "the L2 entry for guest offset %#x sets the zero flag, which version 2 images do not have", guest)
		}
		return nil // reads as zeros whatever the offset says
	}
	switch {
	case off == 0:
		return nil
	case off%uint64(h.clusterSize()) != 0:
		return reject.New(reject.L2Table, "the data cluster for guest offset %#x is at %#x, which is not cluster-aligned", guest, off)
	case off >= uint64(s.fileSize):
		return reject.New(reject.L2Table, "the data cluster for guest offset %#x is at %#x, past the end of the %d-byte file", guest, off, s.fileSize)
	}
	return nil
}

func (s *qcow2Source) extents(ctx context.Context, off, n int64, fn func(extent) error) error {
	h := s.h
	cs := h.clusterSize()
	l2Span := cs * h.l2Entries()
	end := off + n
	var pending extent // coalesces neighbouring zero and data extents
	flush := func() error {
		if pending.length == 0 {
			return nil
		}
		err := fn(pending)
		pending = extent{}
		return err
	}
	emit := func(e extent) error {
		if pending.length > 0 && pending.kind == e.kind && e.kind != extentCompressed &&
			pending.guest+pending.length == e.guest &&
			(e.kind == extentZero || pending.host+pending.length == e.host) {
			pending.length += e.length
			return nil
		}
		if err := flush(); err != nil {
			return err
		}
		pending = e
		return nil
	}
	for pos := off; pos < end; {
		if err := ctx.Err(); err != nil {
			return err
		}
		l1i := uint64(pos / l2Span)
		t, err := s.table(l1i)
		if err != nil {
			return err
		}
		if t == nil {
			next := min(end, (int64(l1i)+1)*l2Span)
			if err := emit(extent{kind: extentZero, guest: pos, length: next - pos}); err != nil {
				return err
			}
			pos = next
			continue
		}
		tableEnd := min(end, (int64(l1i)+1)*l2Span)
		for pos < tableEnd {
			within := pos % cs
			length := min(cs-within, tableEnd-pos)
			e := t[(pos/cs)%h.l2Entries()]
			x := extent{kind: extentZero, guest: pos, length: length}
			switch {
			case e&entryCompressed != 0:
				x.kind = extentCompressed
				x.host, x.clen = h.compressedDescriptor(e)
			case e&entryZero != 0:
			case e&l2OffsetMask != 0:
				x.kind = extentData
				x.host = int64(e&l2OffsetMask) + within
			}
			if err := emit(x); err != nil {
				return err
			}
			pos += length
		}
	}
	return flush()
}

// scratch is per-goroutine decompression state.
type scratch struct {
	cluster []byte // one decompressed cluster
	comp    []byte // compressed bytes, or a copy buffer
	extent  []byte // a decompressed extent being placed in an output file
	br      bytes.Reader
	inflate io.ReadCloser
	zstd    *zstd.Decoder
}

// clusterBuf returns sc.cluster sized to one cluster of cs bytes.
func (sc *scratch) clusterBuf(cs int64) []byte {
	if int64(cap(sc.cluster)) < cs {
		sc.cluster = make([]byte, cs)
	}
	return sc.cluster[:cs]
}

// spareScratches keeps decompression state between uses: a zstd decoder
// or a flate dictionary costs more to allocate than a small image costs to
// read. Decoders made with WithDecoderConcurrency(1) start no goroutines,
// so a dropped scratch needs no closing.
var spareScratches = sync.Pool{New: func() any { return new(scratch) }}

// maxSpareBuffer is the largest buffer a spare scratch keeps.
const maxSpareBuffer = 4 << 20

func getScratch() *scratch { return spareScratches.Get().(*scratch) }

// close hands sc back for reuse.
func (sc *scratch) close() {
	for _, b := range []*[]byte{&sc.cluster, &sc.comp, &sc.extent} {
		if cap(*b) > maxSpareBuffer {
			*b = nil
		}
	}
	spareScratches.Put(sc)
}

// scratchPool hands one scratch to each of at most n concurrent workers.
type scratchPool chan *scratch

func newScratchPool(n int) scratchPool {
	p := make(scratchPool, n)
	for range n {
		p <- getScratch()
	}
	return p
}

func (p scratchPool) get() *scratch   { return <-p }
func (p scratchPool) put(sc *scratch) { p <- sc }

// close releases every scratch; all must have been put back.
func (p scratchPool) close() {
	for range cap(p) {
		(<-p).close()
	}
}

func (s *qcow2Source) readExtent(e extent, dst []byte, sc *scratch) error {
	switch e.kind {
	case extentZero:
		clear(dst)
		return nil
	case extentData:
		return readFull(s.r, dst, e.host)
	}
	cs := s.h.clusterSize()
	out := dst
	if int64(len(dst)) != cs || e.guest%cs != 0 {
		out = sc.clusterBuf(cs)
	}
	if err := s.decompress(e, out, sc); err != nil {
		return err
	}
	if &out[0] != &dst[0] {
		copy(dst, out[e.guest%cs:])
	}
	return nil
}

// decompress inflates the compressed cluster e into out (one cluster).
// It reads the stream only up to compressedEnd, so no two compressed
// clusters share a byte, and stops after one cluster. A stream that ends
// early, is corrupt, or produces a cluster from fewer bytes than its codec
// can (see maxRatio) rejects the image.
func (s *qcow2Source) decompress(e extent, out []byte, sc *scratch) error {
	if s.starts == nil {
		return errNotVerified
	}
	end := s.compressedEnd(e)
	if err := s.checkCompressedRange(e, end); err != nil {
		return err
	}
	n := end - e.host
	if int64(cap(sc.comp)) < n {
		sc.comp = make([]byte, n)
	}
	comp := sc.comp[:n]
	if err := readFull(s.r, comp, e.host); err != nil {
		return err
	}
	sc.br.Reset(comp)
	var dec io.Reader
	if s.h.compression == compressionZstd {
		if sc.zstd == nil {
			d, err := zstd.NewReader(nil,
				zstd.WithDecoderConcurrency(1),
				zstd.WithDecoderLowmem(true),
				zstd.WithDecoderMaxWindow(8<<20))
			if err != nil {
				return err
			}
			sc.zstd = d
		}
		if err := sc.zstd.Reset(&sc.br); err != nil {
			return s.badCluster(e, end, err)
		}
		dec = sc.zstd
	} else {
		// A new decoder for every stream: flate's Huffman tables survive
		// Reset, and the fuzzer found corrupt streams that fail at other
		// offsets after the decoder read another stream, so the same bytes
		// got different verdict texts. Measured on a 250 MB zlib image,
		// inspect costs about 10% more CPU than with a reused decoder.
		sc.inflate = flate.NewReader(&sc.br)
		dec = sc.inflate
	}
	if _, err := io.ReadFull(dec, out); err != nil {
		sc.zstd = nil // never reuse a decoder that failed mid-stream
		return s.badCluster(e, end, err)
	}
	// The decoders read their input byte by byte or block by block, never
	// ahead, so this is what the stream needed.
	consumed := n - int64(sc.br.Len())
	if consumed*s.h.maxRatio() < int64(len(out)) {
		return reject.New(reject.CompressedCluster, "the compressed cluster at guest offset %#x expands %d bytes into %d, more than %s can", s.clusterStart(e), consumed, len(out), s.h.compressionName())
	}
	return nil
}

func (s *qcow2Source) clusterStart(e extent) int64 { return e.guest - e.guest%s.h.clusterSize() }

func (s *qcow2Source) badCluster(e extent, end int64, err error) error {
	short := errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF)
	switch {
	case short && end < e.host+e.clen:
		return reject.New(reject.SharedCluster, "the compressed cluster at guest offset %#x (at %#x) runs into the compressed cluster starting at %#x", s.clusterStart(e), e.host, end)
	case short:
		return reject.New(reject.CompressedCluster, "the compressed cluster at guest offset %#x ends before a full cluster of data", s.clusterStart(e))
	}
	return reject.New(reject.CompressedCluster, "the compressed cluster at guest offset %#x does not decompress (%s): %v", s.clusterStart(e), s.h.compressionName(), err)
}
