//go:build isal && cgo

package containerdisk

import (
	"bufio"
	"bytes"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/klauspost/compress/flate"
	"github.com/klauspost/compress/gzip"
)

// readBothGzips reads b with the ISA-L reader and with Go's (klauspost's,
// as CDI's importer reads gzip layers) and fails unless both accept it
// with the same bytes or both refuse it.
func readBothGzips(t *testing.T, b []byte) {
	t.Helper()
	var isal, goOut []byte
	var isalErr, goErr error
	if zr, err := newGzipReader(bufio.NewReaderSize(bytes.NewReader(b), 128<<10)); err != nil {
		isalErr = err
	} else {
		isal, isalErr = io.ReadAll(zr)
		zr.Close()
	}
	if zr, err := gzip.NewReader(bytes.NewReader(b)); err != nil {
		goErr = err
	} else {
		goOut, goErr = io.ReadAll(zr)
	}
	if (isalErr == nil) != (goErr == nil) || !bytes.Equal(isal, goOut) && isalErr == nil {
		t.Fatalf("the readers disagree on %d bytes: ISA-L read %d bytes (%v), Go %d bytes (%v)", len(b), len(isal), isalErr, len(goOut), goErr)
	}
}

// gzipSeeds are gzip streams of every header shape, several members, and
// deflate data of every block type.
func gzipSeeds(t testing.TB) [][]byte {
	rng := rand.New(rand.NewPCG(1, 2))
	text := bytes.Repeat([]byte("containerDisk disk/disk.img 107:107 "), 300)
	noise := make([]byte, 70<<10)
	for i := range noise {
		noise[i] = byte(rng.Uint32())
	}
	member := func(h gzip.Header, level int, data []byte) []byte {
		var b bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&b, level)
		zw.Header = h
		zw.Write(data)
		zw.Close()
		return b.Bytes()
	}
	plain := member(gzip.Header{}, flate.BestSpeed, text)
	var seeds [][]byte
	seeds = append(seeds,
		plain,
		member(gzip.Header{Name: "disk.tar", Comment: "c", Extra: []byte("IP\x02\x00ab")}, flate.BestCompression, text),
		member(gzip.Header{}, flate.NoCompression, noise),
		member(gzip.Header{}, flate.HuffmanOnly, noise[:5000]),
		member(gzip.Header{}, flate.BestSpeed, nil),
		append(bytes.Clone(plain), member(gzip.Header{}, flate.DefaultCompression, noise)...),
		append(bytes.Clone(plain), 0),                                       // a byte after the last member
		append(bytes.Clone(plain), 0x1f, 0x8b, 8, 8, 0, 0, 0, 0, 0, 0, 'a'), // a name cut by the end
		plain[:len(plain)-3], // a trailer cut short
	)
	hcrc := bytes.Clone(plain)
	hcrc[3] |= gzipFlagHCRC
	seeds = append(seeds, append(hcrc[:10:10], append([]byte{0x12, 0x34}, plain[10:]...)...))
	seeds = append(seeds, member(gzip.Header{Extra: bytes.Repeat([]byte("x"), 65535), Name: "n"}, flate.BestSpeed, text))
	long := member(gzip.Header{Name: string(bytes.Repeat([]byte("n"), 511))}, flate.BestSpeed, text)
	seeds = append(seeds, long)
	longer := append(bytes.Clone(long[:10]), bytes.Repeat([]byte("n"), 512)...) // and its NUL: 513 bytes
	seeds = append(seeds, append(longer, long[10+511:]...))
	reserved := bytes.Clone(plain)
	reserved[3] |= 1 << 5
	seeds = append(seeds, reserved)
	return seeds
}

func TestISALGzipReaderAgreesWithGo(t *testing.T) {
	for _, s := range gzipSeeds(t) {
		readBothGzips(t, s)
		// Each seed cut at, and flipped at, many places.
		for i := 0; i < len(s); i += 1 + len(s)/97 {
			readBothGzips(t, s[:i])
			b := bytes.Clone(s)
			b[i] ^= 0x5a
			readBothGzips(t, b)
		}
	}
}

func FuzzISALGzipReaderAgreesWithGo(f *testing.F) {
	for _, s := range gzipSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) { readBothGzips(t, b) })
}
