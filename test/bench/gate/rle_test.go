package gate

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/imagepipe/imagepipe/internal/containerdisk"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// TestRLELayers decodes the bench's run-length layers with the zstd
// decoder and archive/tar, and with the gate's own layer reader: a
// containerDisk of disk/ and disk/disk.img (107:107, 0444) holding the
// declared bytes, whose tar hashes to the diff ID the layer reports.
func TestRLELayers(t *testing.T) {
	const size = 1 << 20
	layers, err := newRLELayers(size, 0x5a, []byte{0x5a, 0x61})
	if err != nil {
		t.Fatal(err)
	}
	if layers[0].digest == layers[1].digest {
		t.Fatal("layers with different last bytes have one digest")
	}
	for i, l := range layers {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			want := append(bytes.Repeat([]byte{0x5a}, size-rleBlock), bytes.Repeat([]byte{[]byte{0x5a, 0x61}[i]}, rleBlock)...)
			if got, wantMax := len(l.blob), 4*size/rleBlock+2048; got > wantMax {
				t.Errorf("the layer is %d bytes, more than %d", got, wantMax)
			}

			rc, err := l.Uncompressed()
			if err != nil {
				t.Fatal(err)
			}
			defer rc.Close()
			sum := sha256.New()
			tr := tar.NewReader(io.TeeReader(rc, sum))
			for _, w := range []struct {
				name string
				mode int64
				typ  byte
			}{{api.DiskDir, 0o555, tar.TypeDir}, {api.DiskPath, 0o444, tar.TypeReg}} {
				h, err := tr.Next()
				if err != nil {
					t.Fatal(err)
				}
				if h.Name != w.name || h.Mode != w.mode || h.Typeflag != w.typ || h.Uid != api.DiskUID || h.Gid != api.DiskGID {
					t.Errorf("entry %s %o type %c %d:%d; want %s %o type %c %d:%d", h.Name, h.Mode, h.Typeflag, h.Uid, h.Gid, w.name, w.mode, w.typ, api.DiskUID, api.DiskGID)
				}
			}
			disk, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(disk, want) {
				t.Error("disk/disk.img holds other bytes than declared")
			}
			if _, err := tr.Next(); err != io.EOF {
				t.Errorf("after the disk: %v; want the end of the archive", err)
			}
			if _, err := io.Copy(io.Discard, io.TeeReader(rc, sum)); err != nil {
				t.Fatal(err)
			}
			if got := fmt.Sprintf("sha256:%x", sum.Sum(nil)); got != l.diffID.String() {
				t.Errorf("the tar hashes to %s; the layer says %s", got, l.diffID)
			}

			lr, err := containerdisk.OpenLayer(string(types.OCILayerZStd), bytes.NewReader(l.blob))
			if err != nil {
				t.Fatal(err)
			}
			defer lr.Close()
			var got bytes.Buffer
			diffID, err := lr.CopyDisk(t.Context(), &got)
			if err != nil {
				t.Fatal(err)
			}
			if diffID != l.diffID.String() || !bytes.Equal(got.Bytes(), want) {
				t.Errorf("the gate's reader: diff ID %s and %d bytes; want %s and the declared disk", diffID, got.Len(), l.diffID)
			}
		})
	}
}
