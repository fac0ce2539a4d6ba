package convert

import (
	"encoding/binary"
	"math/bits"
)

// outHeaderLength is the v3 header we write: 104 bytes plus the
// compression_type byte, padded to 8, as QEMU 5.1 and later write it.
const outHeaderLength = 112

// qcowLayout places every cluster of a qcow2 output file. A stream is
// written front to back in this order, which needs the allocation map
// before the first byte:
//
//	header | L1 table | refcount table | refcount blocks | L2 tables | data
//
// A file written in one pass (WriteFile) puts the data right after the
// header, in the order it is read, and the tables after it:
//
//	header | data | L2 tables | L1 table | refcount table | refcount blocks
//
// Every cluster is referenced exactly once (refcount 1, so every L1/L2
// entry carries the COPIED flag), data clusters follow guest order, and
// clusters holding only zeros are left unallocated.
type qcowLayout struct {
	vsize       int64
	clusterBits uint
	nonzero     bitmap // bit per guest cluster holding non-zero data
	dataFirst   bool   // the one-pass file layout

	l1Entries  int64
	l1Clusters int64
	rtClusters int64 // refcount table
	rbClusters int64 // refcount blocks
	l2Tables   int64
	data       int64 // data clusters
}

func newQCOWLayout(vsize, clusterSize int64, nonzero bitmap, dataFirst bool) *qcowLayout {
	l := &qcowLayout{vsize: vsize, clusterBits: uint(bits.TrailingZeros64(uint64(clusterSize))), nonzero: nonzero, dataFirst: dataFirst}
	cs := clusterSize
	entries := cs / 8
	l.l1Entries = (vsize + cs*entries - 1) / (cs * entries)
	l.l1Clusters = ceilDiv(l.l1Entries*8, cs)
	l.data = nonzero.count()
	for j := range l.l1Entries {
		if l.tableHasData(j) {
			l.l2Tables++
		}
	}
	// The refcount blocks cover every cluster, themselves and the
	// refcount table included: iterate to the fixed point.
	perBlock := cs / 2 // 16-bit refcounts
	for {
		total := 1 + l.l1Clusters + l.rtClusters + l.rbClusters + l.l2Tables + l.data
		rb := ceilDiv(total, perBlock)
		rt := ceilDiv(rb*8, cs)
		if rb == l.rbClusters && rt == l.rtClusters {
			break
		}
		l.rbClusters, l.rtClusters = rb, rt
	}
	return l
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

func (l *qcowLayout) clusterSize() int64 { return 1 << l.clusterBits }

func (l *qcowLayout) totalClusters() int64 {
	return 1 + l.l1Clusters + l.rtClusters + l.rbClusters + l.l2Tables + l.data
}

func (l *qcowLayout) fileSize() int64 { return l.totalClusters() << l.clusterBits }

// Cluster indexes where each region starts.
func (l *qcowLayout) l1Start() int64 {
	if l.dataFirst {
		return l.l2Start() + l.l2Tables
	}
	return 1
}
func (l *qcowLayout) rtStart() int64 { return l.l1Start() + l.l1Clusters }
func (l *qcowLayout) rbStart() int64 { return l.rtStart() + l.rtClusters }
func (l *qcowLayout) l2Start() int64 {
	if l.dataFirst {
		return l.dataStart() + l.data
	}
	return l.rbStart() + l.rbClusters
}
func (l *qcowLayout) dataStart() int64 {
	if l.dataFirst {
		return 1
	}
	return l.l2Start() + l.l2Tables
}

// tableHasData reports whether L2 table j maps any non-zero cluster. A
// table has at least 64 entries, so it covers whole bitmap words.
func (l *qcowLayout) tableHasData(j int64) bool {
	entries := l.clusterSize() / 8
	return l.nonzero.anyIn(j*entries, entries)
}

// writeMetadata produces every cluster that is not data, one cluster at a
// time, handing each to put with its cluster index. In the stream layout
// the indexes come in increasing order.
func (l *qcowLayout) writeMetadata(put func(cluster int64, b []byte) error) error {
	cs := l.clusterSize()
	buf := make([]byte, cs)
	be := binary.BigEndian
	at := int64(0)
	emit := func() error {
		err := put(at, buf)
		clear(buf)
		at++
		return err
	}

	// Header.
	copy(buf, "QFI\xfb")
	be.PutUint32(buf[4:], 3)
	be.PutUint32(buf[20:], uint32(l.clusterBits))
	be.PutUint64(buf[24:], uint64(l.vsize))
	be.PutUint32(buf[36:], uint32(l.l1Entries))
	be.PutUint64(buf[40:], uint64(l.l1Start()*cs))
	be.PutUint64(buf[48:], uint64(l.rtStart()*cs))
	be.PutUint32(buf[56:], uint32(l.rtClusters))
	be.PutUint32(buf[96:], defaultRefcountOrder)
	be.PutUint32(buf[100:], outHeaderLength)
	// compression_type 0 (zlib) and an empty extension list: zeros.
	if err := emit(); err != nil {
		return err
	}

	// L1 table: the n-th table with data lives at l2Start+n.
	at = l.l1Start()
	next := l.l2Start()
	for j := range l.l1Clusters * (cs / 8) {
		if j < l.l1Entries && l.tableHasData(j) {
			be.PutUint64(buf[(j%(cs/8))*8:], uint64(next*cs)|entryCopied)
			next++
		}
		if (j+1)%(cs/8) == 0 {
			if err := emit(); err != nil {
				return err
			}
		}
	}

	// Refcount table, then blocks: every cluster in the file has refcount 1.
	at = l.rtStart()
	for i := range l.rtClusters * (cs / 8) {
		if i < l.rbClusters {
			be.PutUint64(buf[(i%(cs/8))*8:], uint64((l.rbStart()+i)*cs))
		}
		if (i+1)%(cs/8) == 0 {
			if err := emit(); err != nil {
				return err
			}
		}
	}
	total := l.totalClusters()
	for c := range l.rbClusters * (cs / 2) {
		if c < total {
			be.PutUint16(buf[(c%(cs/2))*2:], 1)
		}
		if (c+1)%(cs/2) == 0 {
			if err := emit(); err != nil {
				return err
			}
		}
	}

	// L2 tables: the k-th non-zero guest cluster is the k-th data cluster.
	at = l.l2Start()
	data := l.dataStart()
	entries := cs / 8
	for j := range l.l1Entries {
		if !l.tableHasData(j) {
			continue
		}
		for i := range entries {
			c := j*entries + i
			if l.nonzero.has(c) {
				be.PutUint64(buf[i*8:], uint64(data*cs)|entryCopied)
				data++
			}
		}
		if err := emit(); err != nil {
			return err
		}
	}
	return nil
}
