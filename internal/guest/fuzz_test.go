package guest

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"testing"
)

// countingReader counts the bytes Probe asks for.
type countingReader struct {
	b    []byte
	size int64 // the size Probe is told, which may exceed len(b)
	read int64
}

func (c *countingReader) ReadAt(p []byte, off int64) (int, error) {
	c.read += int64(len(p))
	if off >= int64(len(c.b)) {
		// Past the bytes given, the disk reads as zeros up to its size.
		n := int(min(int64(len(p)), max(0, c.size-off)))
		clear(p[:n])
		if n < len(p) {
			return n, errShort
		}
		return n, nil
	}
	n := copy(p, c.b[off:])
	if n < len(p) {
		rest := int(min(int64(len(p)-n), max(0, c.size-off-int64(n))))
		clear(p[n : n+rest])
		n += rest
		if n < len(p) {
			return n, errShort
		}
	}
	return n, nil
}

var errShort = bytes.ErrTooLarge // any error: Probe must not care which

// maxProbeRead bounds what Probe reads, whatever the disk declares: the
// MBR, the GPT header and entry array, and one probe per partition.
const maxProbeRead = 2*sectorSize + maxGPTEntries*maxGPTEntrySize + (maxGPTEntries+1)*probeSize

// FuzzProbe: any bytes, declared as a disk of any size, give a layout or
// an error, never a panic, and Probe reads at most maxProbeRead.
func FuzzProbe(f *testing.F) {
	f.Add(gptSeed(), int64(64<<20))
	f.Add(make([]byte, 512), int64(512))
	f.Fuzz(func(t *testing.T, b []byte, size int64) {
		size = max(0, min(size, 1<<50))
		r := &countingReader{b: b, size: size}
		l, err := Probe(r, size)
		if err == nil && l == nil {
			t.Fatal("no layout and no error")
		}
		if r.read > maxProbeRead {
			t.Fatalf("read %d bytes, over %d", r.read, maxProbeRead)
		}
	})
}

// gptSeed is a protective MBR and a GPT header with valid checksums
// naming 128 entries, one an ESP, so that the fuzzer starts past the
// checks.
func gptSeed() []byte {
	b := make([]byte, 34*sectorSize)
	b[510], b[511] = 0x55, 0xAA
	b[446+4] = 0xEE
	binary.LittleEndian.PutUint32(b[446+8:], 1)
	binary.LittleEndian.PutUint32(b[446+12:], 0xFFFFFFFF)
	entries := b[2*sectorSize : 34*sectorSize]
	esp := []byte{0x28, 0x73, 0x2A, 0xC1, 0x1F, 0xF8, 0xD2, 0x11, 0xBA, 0x4B, 0x00, 0xA0, 0xC9, 0x3E, 0xC9, 0x3B}
	copy(entries, esp)
	binary.LittleEndian.PutUint64(entries[32:], 2048)
	binary.LittleEndian.PutUint64(entries[40:], 4095)
	h := b[sectorSize : 2*sectorSize]
	copy(h, "EFI PART")
	binary.LittleEndian.PutUint32(h[8:], 0x00010000)
	binary.LittleEndian.PutUint32(h[12:], 92)
	binary.LittleEndian.PutUint64(h[72:], 2)
	binary.LittleEndian.PutUint32(h[80:], 128)
	binary.LittleEndian.PutUint32(h[84:], 128)
	binary.LittleEndian.PutUint32(h[88:], crc32.ChecksumIEEE(entries))
	binary.LittleEndian.PutUint32(h[16:], crc32.ChecksumIEEE(h[:92]))
	return b
}

// TestTheFuzzSeedIsAValidGPT: the seed reaches the entry array.
func TestTheFuzzSeedIsAValidGPT(t *testing.T) {
	b := gptSeed()
	l, err := Probe(bytes.NewReader(b), 64<<20)
	if err != nil || l.Table != TableGPT || len(l.Partitions) != 1 || l.Partitions[0].Role != RoleESP || len(l.Notes) != 0 {
		t.Fatalf("%+v, %v", l, err)
	}
}
