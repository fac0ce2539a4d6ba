package containerdisk

import (
	"bytes"
	"testing"

	"github.com/imagepipe/imagepipe/internal/convert"
)

// TestTarFramingIsTheWritersTar: head, the disk, tail is exactly the tar
// WriteLayer writes, for disks that end on, before and after a block.
func TestTarFramingIsTheWritersTar(t *testing.T) {
	for _, n := range []int{1, 511, 512, 513, 4096 + 7, 1 << 20} {
		disk := bytes.Repeat([]byte{0xa5}, n)
		var tarball bytes.Buffer
		if _, err := WriteLayer(t.Context(), &bytes.Buffer{}, bytesPayload(disk), CompressionNone, &tarball); err != nil {
			t.Fatal(err)
		}
		head, tail := TarFraming(int64(n))
		if got := append(append(append([]byte(nil), head...), disk...), tail...); !bytes.Equal(got, tarball.Bytes()) {
			t.Errorf("%d bytes: the framing gives %d bytes of tar, the writer %d", n, len(got), tarball.Len())
		}
	}
}

// TestSameAs: a disk is the same as its own planned bytes, and not as
// bytes that differ in one place or in size.
func TestSameAs(t *testing.T) {
	raw := bytes.Repeat([]byte("imagepipe disk "), 70000)[:1<<20]
	img, err := convert.Open(bytes.NewReader(raw), int64(len(raw)), convert.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	disk, err := NewDisk(img, Options{DiskFormat: convert.FormatRaw})
	if err != nil {
		t.Fatal(err)
	}
	changed := bytes.Clone(raw)
	changed[len(changed)-3] ^= 1
	for name, tc := range map[string]struct {
		b    []byte
		want bool
	}{
		"its own bytes": {raw, true}, "one byte changed": {changed, false}, "one byte shorter": {raw[:len(raw)-1], false},
	} {
		same, err := disk.SameAs(t.Context(), bytes.NewReader(tc.b), int64(len(tc.b)))
		if err != nil || same != tc.want {
			t.Errorf("%s: %v, %v; want %v", name, same, err, tc.want)
		}
	}
}
