package convert

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/imagepipe/imagepipe/internal/need"
	"github.com/imagepipe/imagepipe/internal/reject"
)

// TestGuestReadsWhatQEMUReads: the guest reader of a raw disk and of the
// qcow2 images qemu-img makes of it (plain, compressed with zlib and with
// zstd, 4 KiB clusters) reads, at any offset and length, the bytes of the
// raw disk, zeros past the data included; and a rejected image gives no
// reader.
func TestGuestReadsWhatQEMUReads(t *testing.T) {
	qemuImg := need.Program(t, "qemu-img")
	dir := t.TempDir()
	disk := make([]byte, 3<<20+1536)
	rng := rand.New(rand.NewPCG(37, 1))
	for i := range disk {
		if (i>>16)%3 != 1 { // one 64 KiB run in three stays zero
			disk[i] = byte(rng.Uint32() % 7)
		}
	}
	raw := filepath.Join(dir, "disk.raw")
	if err := os.WriteFile(raw, disk, 0o644); err != nil {
		t.Fatal(err)
	}
	images := map[string]string{"raw": raw}
	for name, args := range map[string][]string{
		"qcow2":         {"-O", "qcow2"},
		"qcow2-zlib":    {"-c", "-O", "qcow2"},
		"qcow2-zstd":    {"-c", "-O", "qcow2", "-o", "compression_type=zstd"},
		"qcow2-4k":      {"-O", "qcow2", "-o", "cluster_size=4096"},
		"qcow2-zlib-4k": {"-c", "-O", "qcow2", "-o", "cluster_size=4096"},
	} {
		images[name] = filepath.Join(dir, name+".qcow2")
		run(t, qemuImg, append(append([]string{"convert", "-q", "-f", "raw"}, args...), raw, images[name])...)
	}
	guestSize := int64(len(disk)+511) &^ 511
	want := append(bytes.Clone(disk), make([]byte, guestSize-int64(len(disk)))...)
	for name, path := range images {
		t.Run(name, func(t *testing.T) {
			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			st, _ := f.Stat()
			img, err := Open(f, st.Size(), OpenOptions{})
			if err != nil {
				t.Fatal(err)
			}
			g, err := img.Guest(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			for i := range 200 {
				off := rng.Int64N(guestSize)
				n := 1 + rng.Int64N(200<<10)
				if i%10 == 0 {
					n = rng.Int64N(8) + 1
				}
				p := make([]byte, n)
				got, err := g.ReadAt(p, off)
				end := min(off+n, guestSize)
				if int64(got) != end-off || (end < off+n) != errors.Is(err, io.EOF) || (err != nil && !errors.Is(err, io.EOF)) {
					t.Fatalf("ReadAt(%d bytes at %d) = %d, %v; want %d", n, off, got, err, end-off)
				}
				if !bytes.Equal(p[:got], want[off:end]) {
					t.Fatalf("ReadAt(%d bytes at %d) differs from the raw disk", n, off)
				}
			}
			if _, err := g.ReadAt(make([]byte, 1), guestSize); !errors.Is(err, io.EOF) {
				t.Errorf("reading at the end: %v, want io.EOF", err)
			}
		})
	}

	// A qcow2 whose first L2 entry points past the file opens (Open reads
	// no L2 table) but is rejected, and yields no reader.
	b, err := os.ReadFile(images["qcow2"])
	if err != nil {
		t.Fatal(err)
	}
	l1 := binary.BigEndian.Uint64(b[40:])
	l2 := binary.BigEndian.Uint64(b[l1:]) & 0x00ff_ffff_ffff_fe00
	binary.BigEndian.PutUint64(b[l2:], 0x8000_0010_0000_0000)
	img, err := Open(bytes.NewReader(b), int64(len(b)), OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if g, err := img.Guest(t.Context()); g != nil || reject.As(err) == nil {
		t.Errorf("a qcow2 with an L1 entry past its file: reader %v, %v; want a rejection", g, err)
	}
}
