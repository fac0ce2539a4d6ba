package bootcheck

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/imagepipe/imagepipe/internal/need"
)

// TestXorrisoReadsTheSeed: xorriso, an ISO 9660 reader of its own, finds
// the label and each file's bytes in what WriteSeed wrote. (The Debian
// guest's kernel and cloud-init read it in TestADebianGuestSignalsByDefault.)
func TestXorrisoReadsTheSeed(t *testing.T) {
	xorriso := need.Program(t, "xorriso")
	files := []SeedFile{
		{Name: "meta-data", Data: []byte("instance-id: i-1\n")},
		{Name: "user-data", Data: bytes.Repeat([]byte("#cloud-config\n"), 400)}, // over one sector
		{Name: "network-config", Data: nil},
	}
	var buf bytes.Buffer
	if err := WriteSeed(&buf, files); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	iso := filepath.Join(dir, "seed.iso")
	if err := os.WriteFile(iso, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(xorriso, "-indev", iso, "-pvd_info").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Volume Id    : cidata") {
		t.Errorf("xorriso -pvd_info: %v\n%s\nwant the volume id cidata", err, out)
	}
	for _, f := range files {
		to := filepath.Join(dir, f.Name)
		if out, err := exec.Command(xorriso, "-osirrox", "on", "-indev", iso, "-extract", "/"+strings.ToUpper(f.Name), to).CombinedOutput(); err != nil {
			t.Fatalf("xorriso extracting %s: %v\n%s", f.Name, err, out)
		}
		got, err := os.ReadFile(to)
		if err != nil || !bytes.Equal(got, f.Data) {
			t.Errorf("%s: xorriso read %d bytes (%v); want the %d written", f.Name, len(got), err, len(f.Data))
		}
	}
}

// TestWriteSeedRefusesWhatItCannotWrite: names outside NoCloud's, more
// files or bytes than a seed holds.
func TestWriteSeedRefusesWhatItCannotWrite(t *testing.T) {
	for name, files := range map[string][]SeedFile{
		"a path":         {{Name: "../meta-data"}},
		"upper case":     {{Name: "Meta-Data"}},
		"an empty name":  {{Name: ""}},
		"a long name":    {{Name: strings.Repeat("a", 31)}},
		"a file too big": {{Name: "user-data", Data: make([]byte, 1<<20+1)}},
		"too many files": make([]SeedFile, 17),
	} {
		if err := WriteSeed(&bytes.Buffer{}, files); err == nil {
			t.Errorf("%s: written; want an error", name)
		}
	}
}
