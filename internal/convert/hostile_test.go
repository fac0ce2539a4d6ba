package convert

import (
	"bytes"
	"encoding/binary"
	"io"
	"sync/atomic"
	"testing"
)

// qcowBuilder lays out a qcow2 v3 image by hand, so tests can aim its
// tables anywhere: the header in cluster 0, then the L1 table, then an
// empty refcount table, then whatever the test allocates.
type qcowBuilder struct {
	bits uint32
	cs   int64
	b    []byte
	l1   int64 // file offset of the L1 table
	rt   int64 // file offset of the refcount table
	zstd bool
}

func newQCOWBuilder(clusterBits uint32, vsize uint64, useZstd bool) *qcowBuilder {
	q := &qcowBuilder{bits: clusterBits, cs: 1 << clusterBits, zstd: useZstd}
	h := qcowHeader{clusterBits: clusterBits, size: vsize}
	l1Entries := h.l1Needed()
	q.b = make([]byte, q.cs)
	q.l1 = q.alloc((int64(l1Entries)*8 + q.cs - 1) / q.cs)
	q.rt = q.alloc(1)
	be := binary.BigEndian
	copy(q.b, "QFI\xfb")
	be.PutUint32(q.b[4:], 3)
	be.PutUint32(q.b[20:], clusterBits)
	be.PutUint64(q.b[24:], vsize)
	be.PutUint32(q.b[36:], uint32(l1Entries))
	be.PutUint64(q.b[40:], uint64(q.l1))
	be.PutUint64(q.b[48:], uint64(q.rt))
	be.PutUint32(q.b[56:], 1)
	be.PutUint32(q.b[96:], 4)
	be.PutUint32(q.b[100:], outHeaderLength)
	if useZstd {
		be.PutUint64(q.b[72:], incompatCompression)
		q.b[104] = compressionZstd
	}
	return q
}

// alloc appends n zeroed clusters and returns the offset of the first.
func (q *qcowBuilder) alloc(n int64) int64 {
	off := int64(len(q.b))
	q.b = append(q.b, make([]byte, n*q.cs)...)
	return off
}

func (q *qcowBuilder) put(off int64, v uint64) { binary.BigEndian.PutUint64(q.b[off:], v) }

// setL1 points L1 entry i at the L2 table at off.
func (q *qcowBuilder) setL1(i int64, off int64) { q.put(q.l1+8*i, entryCopied|uint64(off)) }

// setL2 sets entry j of the L2 table at table.
func (q *qcowBuilder) setL2(table, j int64, e uint64) { q.put(table+8*j, e) }

// data is the L2 entry of an uncompressed cluster at off.
func (q *qcowBuilder) data(off int64) uint64 { return entryCopied | uint64(off) }

// compressed is the L2 entry of n bytes of compressed data at host, with
// the sector count QEMU writes: up to the end of the sector holding the
// last byte.
func (q *qcowBuilder) compressed(host, n int64) uint64 {
	x := 62 - (q.bits - 8)
	sectors := uint64((host+n-1)>>9 - host>>9)
	return entryCompressed | sectors<<x | uint64(host)
}

// bytes returns the file.
func (q *qcowBuilder) bytes() []byte { return q.b }

// packer writes compressed streams back to back, byte-packed as QEMU
// does, into clusters it allocates as it goes (contiguously, so a stream
// may cross a cluster boundary).
type packer struct {
	q      *qcowBuilder
	cursor int64 // next free byte
	end    int64 // end of the allocated run
}

func (p *packer) add(stream []byte) (host int64) {
	for p.cursor+int64(len(stream)) > p.end {
		off := p.q.alloc(1)
		if off != p.end {
			p.cursor = off
		}
		p.end = off + p.q.cs
	}
	host = p.cursor
	copy(p.q.b[host:], stream)
	p.cursor += int64(len(stream))
	return host
}

// minimalZstd is the shortest zstd frame QEMU's zstd accepts for a cluster
// of the byte v: a single-segment frame of RLE blocks of 128 KiB each.
func minimalZstd(cs int64, v byte) []byte {
	b := []byte{0x28, 0xb5, 0x2f, 0xfd, 0xa0} // magic; single segment, 4-byte content size
	b = binary.LittleEndian.AppendUint32(b, uint32(cs))
	for left := cs; left > 0; {
		n := min(left, 128<<10)
		left -= n
		hdr := uint32(n)<<3 | 1<<1 // RLE
		if left == 0 {
			hdr |= 1 // last block
		}
		b = append(b, byte(hdr), byte(hdr>>8), byte(hdr>>16), v)
	}
	return b
}

// readCounter counts the bytes read through it; safe for concurrent use.
type readCounter struct {
	r io.ReaderAt
	n atomic.Int64
}

func (c *readCounter) ReadAt(p []byte, off int64) (int, error) {
	n, err := c.r.ReadAt(p, off)
	c.n.Add(int64(n))
	return n, err
}

// openBytes opens an in-memory image behind a read counter.
func openBytes(t *testing.T, b []byte, opts OpenOptions) (*Image, *readCounter, error) {
	t.Helper()
	rc := &readCounter{r: bytes.NewReader(b)}
	img, err := Open(rc, int64(len(b)), opts)
	return img, rc, err
}
