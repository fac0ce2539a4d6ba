package gate

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/imagepipe/imagepipe/internal/need"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// TestTheVerdictSaysWhatTheDiskHolds: a raw disk pushed by another client
// is verified in the spool, and its verdict carries what the disk holds,
// as guest.Inspect read it there: here an ext4 filesystem on the whole
// disk, made by mkfs.ext4, with Debian's os-release and cloud-init. A disk
// of random bytes is accepted all the same, its guest unknown.
func TestTheVerdictSaysWhatTheDiskHolds(t *testing.T) {
	mkfs := need.Program(t, "mkfs.ext4")
	root := t.TempDir()
	for name, text := range map[string]string{
		"etc/os-release":     "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nVERSION_ID=\"12\"\nID=debian\n",
		"usr/bin/cloud-init": "#!/usr/bin/python3\n",
	} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	img := filepath.Join(t.TempDir(), "disk.raw")
	if err := os.WriteFile(img, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 16<<20); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(mkfs, "-q", "-F", "-d", root, img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v\n%s", err, out)
	}
	disk, err := os.ReadFile(img)
	if err != nil {
		t.Fatal(err)
	}

	e := newEnv(t)
	for _, tc := range []struct {
		name string
		disk []byte
		want func(*api.GuestReport) bool
	}{
		{"debian", disk, func(g *api.GuestReport) bool {
			return g != nil && g.PartitionTable == "none" && g.Filesystem == "ext4" && g.OS != nil && g.OS.ID == "debian" && g.OS.VersionID == "12" && g.CloudInit
		}},
		{"random", rawDisk(t, 4<<20, 41), func(g *api.GuestReport) bool {
			return g != nil && g.OS == nil && len(g.Notes) > 0
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := craftImage(t, tc.disk).push(t, e, "acme/"+tc.name)
			v, err := e.v.Verify(t.Context(), mustDigest(t, e.host+"/acme/"+tc.name+"@"+d))
			if err != nil || v.Verdict != api.VerdictAccepted || len(v.Images) != 1 {
				t.Fatalf("%+v, %v", v, err)
			}
			if g := v.Images[0].Guest; !tc.want(g) {
				t.Errorf("the verdict's guest: %+v", g)
			}
		})
	}
}
