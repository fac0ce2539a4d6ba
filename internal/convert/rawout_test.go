package convert

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/imagepipe/imagepipe/internal/reject"

	"github.com/imagepipe/imagepipe/internal/need"
)

// TestRawOutputOfAnotherFormatRefused converts qcow2 images whose guest
// disks spell other formats' signatures. Raw output would hand the next
// reader a file it probes as that format, so it must be refused before a
// byte is written; qcow2 output names its format and stays accepted.
func TestRawOutputOfAnotherFormatRefused(t *testing.T) {
	need.Program(t, "qemu-io")
	tests := []struct {
		name   string
		writes []string // qemu-io commands on the guest disk
		refuse bool
	}{
		{"guest starts with a qcow2 header", []string{"write -P 0 0 64k", "write -P 0x51 0 1", "write -P 0x46 1 1", "write -P 0x49 2 1", "write -P 0xfb 3 1", "write -P 0 4 3", "write -P 3 7 1"}, true},
		{"guest ends with a vhd footer", []string{"write -P 0x63 1048064 1", "write -P 0x6f 1048065 1", "write -P 0x6e 1048066 1", "write -P 0x65 1048067 1", "write -P 0x63 1048068 1", "write -P 0x74 1048069 1", "write -P 0x69 1048070 1", "write -P 0x78 1048071 1", "write -P 7 0 64k"}, true}, // data written last ends the file, so only the guest ends with the footer
		{"guest is a plain disk with a boot signature", []string{"write -P 0x55 510 1", "write -P 0xaa 511 1", "write -P 7 64k 64k"}, false},
		// An ISO filesystem is raw to every reader.
		{"guest is an iso filesystem", []string{"write -P 0x43 32769 1", "write -P 0x44 32770 1", "write -P 0x30 32771 1", "write -P 0x30 32772 1", "write -P 0x31 32773 1"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "disk.qcow2")
			run(t, "qemu-img", "create", "-q", "-f", "qcow2", path, "1M")
			args := []string{"-f", "qcow2"}
			for _, w := range tt.writes {
				args = append(args, "-c", w)
			}
			run(t, "qemu-io", append(args, path)...)
			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			st, _ := f.Stat()
			img, err := Open(f, st.Size(), OpenOptions{})
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			var out bytes.Buffer
			_, err = img.Plan(t.Context(), Options{To: FormatRaw})
			if tt.refuse {
				if re := reject.As(err); re == nil || re.Reason != reject.AmbiguousRaw {
					t.Fatalf("raw Plan: %v, want a %s rejection", err, reject.AmbiguousRaw)
				}
				raw, err := os.Create(filepath.Join(t.TempDir(), "out.raw"))
				if err != nil {
					t.Fatal(err)
				}
				defer raw.Close()
				if _, err := img.WriteFile(t.Context(), raw, Options{To: FormatRaw}); reject.As(err) == nil || reject.As(err).Reason != reject.AmbiguousRaw {
					t.Fatalf("raw WriteFile: %v, want a %s rejection", err, reject.AmbiguousRaw)
				}
				if st, _ := raw.Stat(); st.Size() != 0 {
					t.Errorf("raw WriteFile wrote %d bytes before refusing", st.Size())
				}
			} else if err != nil {
				t.Fatalf("raw Plan: %v", err)
			}
			p, err := img.Plan(t.Context(), Options{})
			if err != nil {
				t.Fatalf("qcow2 Plan: %v", err)
			}
			if err := p.Write(t.Context(), &out); err != nil {
				t.Fatalf("qcow2 Write: %v", err)
			}
		})
	}
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
}
