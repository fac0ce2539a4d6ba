package diskimage

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/imagepipe/imagepipe/internal/containerdisk"
	"github.com/imagepipe/imagepipe/internal/convert"
	"github.com/imagepipe/imagepipe/internal/disktest"
	"github.com/imagepipe/imagepipe/internal/publish"
	"github.com/imagepipe/imagepipe/internal/reject"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// qcow2Disk is a qcow2 image of rawDisk(size) made by the disk engine,
// with the header's virtual size then set to vsize.
func qcow2Disk(t *testing.T, size int, vsize uint64) []byte {
	t.Helper()
	raw := rawDisk(size)
	img, err := convert.Open(bytes.NewReader(raw), int64(len(raw)), convert.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := img.Plan(t.Context(), convert.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := p.Write(t.Context(), &out); err != nil {
		t.Fatal(err)
	}
	b := out.Bytes()
	binary.BigEndian.PutUint64(b[24:], vsize)
	return b
}

// TestVirtualSizeVerdictsAgree checks, for disks whose size is not a whole
// number of 512-byte sectors, that imagectl's verdict and the syncer's
// (Check) agree: what import publishes, the check accepts
// with the same virtual size, in both disk formats; what the engine
// refuses, the check refuses too when the same disk is pushed by hand, so
// nothing imagectl publishes is refused later.
func TestVirtualSizeVerdictsAgree(t *testing.T) {
	host := disktest.Registry(t)
	c := testClient(t)
	for i, tc := range []struct {
		name  string
		disk  []byte
		want  reject.Reason // "" when accepted
		vsize int64         // the virtual size both sides must report
	}{
		// Raw disks of odd sizes read as QEMU reads them: padded to 512.
		{"raw-1-byte", rawDisk(1), "", 512},
		{"raw-1000-bytes", rawDisk(1000), "", 1024},
		{"raw-513-bytes", rawDisk(513), "", 1024},
		{"raw-1024-bytes", rawDisk(1024), "", 1024},
		{"qcow2-1024-bytes", qcow2Disk(t, 1024, 1024), "", 1024},
		// QEMU would read 512 of these 1000 bytes: refused on both sides.
		{"qcow2-1000-bytes", qcow2Disk(t, 1024, 1000), reject.VirtualSize, 0},
		{"qcow2-513-bytes", qcow2Disk(t, 1024, 513), reject.VirtualSize, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			img, err := convert.Open(bytes.NewReader(tc.disk), int64(len(tc.disk)), convert.OpenOptions{})
			if err == nil {
				_, err = img.Verify(t.Context())
			}
			if tc.want != "" {
				if re := reject.As(err); re == nil || re.Reason != tc.want {
					t.Fatalf("engine: %v, want %s", err, tc.want)
				}
				// Pushed by someone else, as a containerDisk of the right shape.
				layer := static.NewLayer(gzipped(t, makeTar(t, diskDirEntry(), diskFileEntry(tc.disk))), types.OCILayer)
				ref := disktest.PushLayers(t, fmt.Sprintf("%s/acme/vsize:%d", host, i), nil, layer)
				rep, err := Check(t.Context(), c, ref)
				if err != nil {
					t.Fatal(err)
				}
				if rep.Verdict != api.VerdictRejected || len(rep.Reasons) != 1 || rep.Reasons[0].Code != string(tc.want) {
					t.Errorf("syncer's check: %+v, want rejected for %s", rep, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatalf("engine: %v", err)
			}
			if got := img.Info().VirtualSize; got != tc.vsize {
				t.Fatalf("engine: virtual size %d, want %d", got, tc.vsize)
			}
			for _, format := range []convert.Format{convert.FormatQCOW2, convert.FormatRaw} {
				tag := disktest.MustTag(t, fmt.Sprintf("%s/acme/vsize:%d-%s", host, i, format))
				src := disktest.Source{Image: img, Digest: "sha256:" + fmt.Sprintf("%064x", i)}
				res, err := importer(c).Import(t.Context(), tag, src.ContainerDisk(t, containerdisk.Options{DiskFormat: format}), src, publish.ImportOptions{})
				if err != nil {
					t.Fatal(err)
				}
				rep, err := Check(t.Context(), c, tag)
				if err != nil {
					t.Fatal(err)
				}
				if rep.Verdict != api.VerdictAccepted || rep.VirtualSize != tc.vsize || res.VirtualSize != tc.vsize {
					t.Errorf("%s: import says %d bytes; syncer's check %+v", format, res.VirtualSize, rep)
				}
				if format == convert.FormatRaw && rep.DiskSize != tc.vsize {
					t.Errorf("raw disk.img is %d bytes, virtual size %d", rep.DiskSize, tc.vsize)
				}
			}
		})
	}
}
