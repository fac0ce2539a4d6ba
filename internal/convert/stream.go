package convert

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// MaxStreamTables bounds the bytes of tables (header, L1, refcounts, L2)
// a StreamCheck holds in memory: 16 MiB maps 120 GiB of non-zero guest
// data. A file with more tables goes to the fallback writer.
const MaxStreamTables = 16 << 20

// StreamOutcome is what a StreamCheck found once the whole file passed.
type StreamOutcome int

const (
	// StreamCanonical: the file is byte for byte what Plan.Write makes of
	// its own content (qcow2, default options); the engine verified its
	// tables, and the data clusters it dropped hold guest data and nothing
	// else.
	StreamCanonical StreamOutcome = iota
	// StreamDiverted: the file is something else; every byte of it went
	// to the fallback writer.
	StreamDiverted
	// StreamLost: the tables are canonical but a data cluster is not (it
	// holds only zeros, or bytes past the virtual size); the data before
	// it was dropped, so the file must be read again to be verified.
	StreamLost
)

// StreamCheck reads a file as it streams past, once, and finds whether it
// is exactly the qcow2 file this package writes for its content, without
// storing it: a canonical file is all tables first, then one data cluster
// per non-zero guest cluster in guest order (see qcowLayout). The tables
// are held and compared with the ones writeMetadata makes for the
// allocation they describe, then verified by the engine as Open and
// Verify would; each data cluster is checked and dropped.
//
// Anything else, seen while every byte is still held, sends those bytes
// and the rest of the stream to the fallback writer, so that the caller
// can verify the file the usual way without reading it again.
type StreamCheck struct {
	size     int64 // the file's size, as declared before its first byte
	opts     OpenOptions
	fallback io.Writer

	outcome  StreamOutcome
	held     []byte // the file's first bytes: its tables, while canonical
	last     []byte // the file's last sector, which format detection reads
	metaEnd  int64  // size of the tables; 0 until the refcount table is held
	vsize    int64  // the header's virtual size, once metaEnd is set
	l2Tables int64
	layout   *qcowLayout // set once the tables are checked
	n        int64       // bytes passed
	partial  []byte      // a data cluster split across writes
	data     int64       // data clusters passed
}

// NewStreamCheck checks a file of size bytes that Open would open with
// opts.
func NewStreamCheck(size int64, opts OpenOptions, fallback io.Writer) *StreamCheck {
	if opts.MaxVirtualSize <= 0 {
		opts.MaxVirtualSize = DefaultMaxVirtualSize
	}
	return &StreamCheck{size: size, opts: opts, fallback: fallback}
}

// Write checks p; it fails only when the fallback writer fails or the
// stream is longer than declared.
func (s *StreamCheck) Write(p []byte) (int, error) {
	n := len(p)
	if s.n+int64(n) > s.size {
		return 0, fmt.Errorf("the disk streams more than its declared %d bytes", s.size)
	}
	s.n += int64(n)
	if s.n > s.size-lastSector {
		s.keepLast(p)
	}
	switch {
	case s.outcome == StreamDiverted:
		return n, s.pass(p)
	case s.outcome == StreamLost:
		return n, nil
	case s.layout == nil:
		return n, s.hold(p)
	}
	return n, s.checkData(p)
}

// lastSector is the bytes at the file's end that Detect reads.
const lastSector = 512

// keepLast keeps what p holds of the file's last sector; p ends at s.n.
func (s *StreamCheck) keepLast(p []byte) {
	from := max(s.size-lastSector, 0)
	start := s.n - int64(len(p))
	if start < from {
		p = p[from-start:]
	}
	s.last = append(s.last, p...)
}

func (s *StreamCheck) pass(p []byte) error {
	_, err := s.fallback.Write(p)
	return err
}

// hold keeps p with the tables and checks them once they are all held;
// what follows them is data.
func (s *StreamCheck) hold(p []byte) error {
	s.held = append(s.held, p...)
	if !s.measureTables() {
		return s.divert()
	}
	if s.metaEnd == 0 || int64(len(s.held)) < s.metaEnd {
		return nil
	}
	if !s.tablesCanonical() {
		return s.divert()
	}
	rest := s.held[s.metaEnd:]
	s.held = s.held[:s.metaEnd:s.metaEnd]
	return s.checkData(rest)
}

// divert sends what is held to the fallback writer, and from then on
// all that passes.
func (s *StreamCheck) divert() error {
	s.outcome, s.layout = StreamDiverted, nil
	held := s.held
	s.held = nil
	return s.pass(held)
}

// measureTables works out, from what is held so far, how long the tables
// of a canonical file of this header are; false when the file cannot be
// canonical (or its tables are too large to hold).
func (s *StreamCheck) measureTables() bool {
	if s.metaEnd != 0 || len(s.held) < outHeaderLength {
		return true
	}
	h := s.held
	be := binary.BigEndian
	cs := int64(DefaultClusterSize)
	vsize := int64(be.Uint64(h[24:]))
	if !bytes.Equal(h[:4], []byte("QFI\xfb")) || be.Uint32(h[20:]) != 16 ||
		vsize <= 0 || vsize%512 != 0 || vsize > s.opts.MaxVirtualSize || s.size%cs != 0 {
		return false
	}
	entries := cs / 8
	l1Entries := ceilDiv(vsize, cs*entries)
	l1Clusters := ceilDiv(l1Entries*8, cs)
	rtClusters := int64(be.Uint32(h[56:]))
	held := int64(len(h))
	fixed := (1 + l1Clusters + rtClusters) * cs
	if fixed > MaxStreamTables {
		return false
	}
	if held < fixed {
		return true
	}
	// The refcount blocks and L2 tables are counted from the entries that
	// point at them; writeMetadata's comparison checks where they point.
	var rb, l2 int64
	for i := range rtClusters * entries {
		if be.Uint64(h[(1+l1Clusters)*cs+i*8:]) != 0 {
			rb++
		}
	}
	for j := range l1Entries {
		if be.Uint64(h[cs+j*8:]) != 0 {
			l2++
		}
	}
	end := fixed + (rb+l2)*cs
	if end > MaxStreamTables || end > s.size {
		return false
	}
	s.metaEnd, s.vsize, s.l2Tables = end, vsize, l2
	return true
}

// tablesCanonical compares the held tables with the ones writeMetadata
// makes for the allocation their L2 tables describe; on success the data
// clusters are what is left.
func (s *StreamCheck) tablesCanonical() bool {
	h := s.held[:s.metaEnd]
	be := binary.BigEndian
	cs := int64(DefaultClusterSize)
	entries := cs / 8
	guestClusters := ceilDiv(s.vsize, cs)
	// In a canonical file the L2 tables come last among the tables, in L1
	// order.
	nonzero := newBitmap(guestClusters)
	table := s.metaEnd/cs - s.l2Tables
	for j := range ceilDiv(s.vsize, cs*entries) {
		if be.Uint64(h[cs+j*8:]) == 0 {
			continue
		}
		for i := range entries {
			if be.Uint64(h[table*cs+i*8:]) != 0 {
				if j*entries+i >= guestClusters {
					return false
				}
				nonzero.set(j*entries + i)
			}
		}
		table++
	}
	l := newQCOWLayout(s.vsize, cs, nonzero, false)
	if l.fileSize() != s.size || (l.totalClusters()-l.data)*cs != s.metaEnd {
		return false
	}
	err := l.writeMetadata(func(cluster int64, b []byte) error {
		if !bytes.Equal(h[cluster*cs:(cluster+1)*cs], b) {
			return errDiffer
		}
		return nil
	})
	if err != nil {
		return false
	}
	s.layout = l
	return true
}

var errDiffer = errors.New("differs")

// errNotKept is what a streamed file's dropped data reads as.
var errNotKept = errors.New("the data of a streamed disk is not kept")

// keptParts serves what a StreamCheck kept of a file: its tables and its
// last sector.
type keptParts struct {
	tables, last []byte
	size         int64
}

func (k *keptParts) ReadAt(p []byte, off int64) (int, error) {
	end := off + int64(len(p))
	switch {
	case off >= 0 && end <= int64(len(k.tables)):
		return copy(p, k.tables[off:]), nil
	case off >= k.size-int64(len(k.last)) && end <= k.size:
		return copy(p, k.last[off-(k.size-int64(len(k.last))):]), nil
	}
	return 0, errNotKept
}

// checkData checks data clusters as they pass: each holds a non-zero byte
// of guest data, and the last guest cluster nothing past the virtual size.
func (s *StreamCheck) checkData(p []byte) error {
	cs := int(s.layout.clusterSize())
	if len(s.partial) > 0 {
		k := min(len(p), cs-len(s.partial))
		s.partial = append(s.partial, p[:k]...)
		p = p[k:]
		if len(s.partial) < cs {
			return nil
		}
		s.checkCluster(s.partial)
		s.partial = s.partial[:0]
	}
	for len(p) >= cs && s.outcome == StreamCanonical {
		s.checkCluster(p[:cs])
		p = p[cs:]
	}
	if len(p) > 0 && s.outcome == StreamCanonical {
		if s.partial == nil {
			s.partial = make([]byte, 0, cs)
		}
		s.partial = append(s.partial, p...)
	}
	return nil
}

func (s *StreamCheck) checkCluster(c []byte) {
	l := s.layout
	s.data++
	guest := len(c)
	if s.data == l.data {
		// The last data cluster is the last guest cluster when that one is
		// non-zero: the canonical file has zeros past the virtual size.
		cs := l.clusterSize()
		if last := (l.vsize - 1) / cs; l.nonzero.has(last) {
			guest = int(l.vsize - last*cs)
		}
	}
	if isZero(c[:guest]) || !isZero(c[guest:]) {
		s.outcome = StreamLost
	}
}

// Finish reports what the stream was, once all of it passed. A canonical
// file is then opened and verified by the engine as Open and Verify would,
// from its tables and last sector: Info is the image's, and a
// *reject.Error the engine's verdict on it.
func (s *StreamCheck) Finish(ctx context.Context) (StreamOutcome, Info, error) {
	if s.n != s.size {
		return 0, Info{}, fmt.Errorf("the disk streamed %d of its declared %d bytes", s.n, s.size)
	}
	if s.outcome == StreamCanonical && s.layout == nil {
		// Too short to hold its tables: everything is still held.
		if err := s.divert(); err != nil {
			return 0, Info{}, err
		}
	}
	if s.outcome != StreamCanonical {
		return s.outcome, Info{}, nil
	}
	img, err := Open(&keptParts{tables: s.held, last: s.last, size: s.size}, s.size, s.opts)
	if err == nil {
		_, err = img.Verify(ctx)
	}
	if errors.Is(err, errNotKept) {
		return StreamLost, Info{}, nil // the engine wants more than tables
	}
	if err != nil {
		return 0, Info{}, err
	}
	return StreamCanonical, img.Info(), nil
}
