package convert

import (
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/imagepipe/imagepipe/internal/need"
	"github.com/imagepipe/imagepipe/internal/reject"
)

// TestExtensionLengthCheckedAsQEMUDoes: QEMU checks each header
// extension's length before it looks at its type, so an end mark whose
// length runs past the first cluster makes the image one QEMU refuses to
// open; Open must refuse it too, and accept the same end mark with a
// length that fits.
func TestExtensionLengthCheckedAsQEMUDoes(t *testing.T) {
	qemuImg := need.Program(t, "qemu-img")
	for _, tc := range []struct {
		length uint32
		refuse bool
	}{
		{0, false},
		{512 - outHeaderLength - 8, false}, // ends with the cluster
		{512 - outHeaderLength - 7, true},
		{0xffff_fff0, true},
	} {
		q := newQCOWBuilder(9, 64<<10, false)
		binary.BigEndian.PutUint32(q.b[outHeaderLength+4:], tc.length) // the end mark's
		path := filepath.Join(t.TempDir(), "disk.qcow2")
		if err := os.WriteFile(path, q.bytes(), 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(qemuImg, "info", "-f", "qcow2", path).CombinedOutput()
		if qemuRefuses := err != nil; qemuRefuses != tc.refuse {
			t.Fatalf("end mark of %d bytes: qemu-img info refuses: %v, the case expects %v\n%s", tc.length, qemuRefuses, tc.refuse, out)
		}
		_, _, err = openBytes(t, q.bytes(), OpenOptions{})
		if re := reject.As(err); tc.refuse != (err != nil) || (tc.refuse && (re == nil || re.Reason != reject.HeaderExtension)) {
			t.Errorf("end mark of %d bytes: Open: %v, want refused: %v (%s)", tc.length, err, tc.refuse, reject.HeaderExtension)
		}
	}
}
