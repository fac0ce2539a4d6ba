package gate

import (
	"bytes"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/imagepipe/imagepipe/internal/containerdisk"
	"github.com/imagepipe/imagepipe/internal/convert"
	"github.com/imagepipe/imagepipe/internal/publish"

	"github.com/imagepipe/imagepipe/internal/need"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// TestTheVerdictSaysWhatTheDiskHolds: the verdict carries what the disk
// holds, as guest.Inspect read it: here an ext4 filesystem on the whole
// disk, made by mkfs.ext4, with Debian's os-release and cloud-init. A raw
// disk pushed by another client is read in the spool; imagectl's qcow2,
// verified as it streams, from its copy there, unless its data passes
// the verification's spool share: then the guest is unknown and says why,
// and the image is accepted all the same, as is a disk of random bytes.
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
	debian := func(g *api.GuestReport) bool {
		return g != nil && g.PartitionTable == "none" && g.Filesystem == "ext4" && g.OS != nil && g.OS.ID == "debian" && g.OS.VersionID == "12" && g.CloudInit
	}
	crafted := func(disk []byte) func(*testing.T, *env, string) string {
		return func(t *testing.T, e *env, repo string) string { return craftImage(t, disk).push(t, e, repo) }
	}
	imagectl := func(t *testing.T, e *env, repo string) string {
		return e.importDisk(t, repo, disk, containerdisk.Options{DiskFormat: convert.FormatQCOW2, Compression: containerdisk.CompressionZstd}, publish.ImportOptions{})
	}

	e := newEnv(t)
	var logs bytes.Buffer
	e.v.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	for _, tc := range []struct {
		name     string
		push     func(*testing.T, *env, string) string
		maxSpool int64
		want     func(*api.GuestReport) bool
		streamed bool
	}{
		{name: "debian", push: crafted(disk), want: debian},
		{name: "random", push: crafted(rawDisk(t, 4<<20, 41)), want: func(g *api.GuestReport) bool {
			return g != nil && g.OS == nil && len(g.Notes) > 0
		}},
		{name: "imagectl", push: imagectl, want: debian, streamed: true},
		{name: "over-the-share", push: imagectl, maxSpool: 64 << 10, streamed: true, want: func(g *api.GuestReport) bool {
			return g != nil && g.OS == nil && len(g.Notes) == 1 && strings.Contains(g.Notes[0], "spool share")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e.v.MaxSpool = tc.maxSpool
			logs.Reset()
			d := tc.push(t, e, "acme/"+tc.name)
			v, err := e.v.Verify(t.Context(), mustDigest(t, e.host+"/acme/"+tc.name+"@"+d))
			if err != nil || v.Verdict != api.VerdictAccepted || len(v.Images) != 1 {
				t.Fatalf("%+v, %v", v, err)
			}
			if g := v.Images[0].Guest; !tc.want(g) {
				t.Errorf("the verdict's guest: %+v", g)
			}
			if streamed := strings.Contains(logs.String(), "streamed=true"); streamed != tc.streamed {
				t.Errorf("verified as it streamed: %v, want %v\n%s", streamed, tc.streamed, logs.String())
			}
		})
	}
}

// TestAGuestThatRunsAwayCostsOnlyItsReport: the guest is read in a
// process of its own, which bounds its memory (RLIMIT_DATA) and CPU time
// (RLIMIT_CPU) itself; readers that run past either (played here by the
// test binary, as inspect-one bounds itself) cost the image its guest
// report, a note saying why, never its verdict.
func TestAGuestThatRunsAwayCostsOnlyItsReport(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t)
	e.v.Inspector = &Inspector{Path: exe, MemoryLimit: 192 << 20, CPULimit: time.Second}
	for _, tc := range []struct{ mode, want string }{
		{"inspect-hog", "fatal error: runtime:"}, // out of memory, or cannot allocate it
		{"inspect-spin", "CPU time limit of 1s"},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			t.Setenv("PLAY_GATE_CHILD", tc.mode)
			d := craftImage(t, rawDisk(t, 4<<20, 43)).push(t, e, "acme/"+tc.mode)
			v, err := e.v.Verify(t.Context(), mustDigest(t, e.host+"/acme/"+tc.mode+"@"+d))
			if err != nil || v.Verdict != api.VerdictAccepted || len(v.Images) != 1 {
				t.Fatalf("%+v, %v; want accepted", v, err)
			}
			g := v.Images[0].Guest
			if g == nil || g.OS != nil || len(g.Notes) != 1 || !strings.Contains(g.Notes[0], tc.want) {
				t.Errorf("the guest report: %+v; want one note saying %q", g, tc.want)
			}
		})
	}
}
