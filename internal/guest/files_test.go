package guest

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/imagepipe/imagepipe/pkg/api"
)

func write(t *testing.T, p, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, p string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
}

// openGuest makes an ext4 filesystem holding the tree setup writes, with
// mkfs.ext4 -d (e2fsprogs copies the tree itself, links and holes
// included), opens it and reads its os-release.
func openGuest(t *testing.T, setup func(root string)) (*api.GuestOS, error) {
	t.Helper()
	return ReadOSRelease(openTree(t, setup))
}

// openTree makes an ext4 filesystem holding the tree setup writes, with
// mkfs.ext4 -d, and opens it.
func openTree(t *testing.T, setup func(root string)) fs.FS {
	t.Helper()
	root := t.TempDir()
	setup(root)
	img := filepath.Join(t.TempDir(), "fs.img")
	if err := os.Truncate(createFile(t, img), 64*mib); err != nil {
		t.Fatal(err)
	}
	run(t, "mkfs.ext4", "-q", "-F", "-d", root, img)
	f, err := os.Open(img)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	fsys, err := OpenFS(f, 0, 64*mib, FsExt4)
	if err != nil {
		t.Fatal(err)
	}
	return fsys
}

const debian = "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nNAME=\"Debian GNU/Linux\"\nVERSION_ID=\"12\"\nID=debian\n"

// TestOSReleaseAsTheGuestReadsIt: /etc/os-release as Debian ships it (a
// relative link into /usr/lib), through an absolute link and a linked
// directory, and hostile trees: a link loop, a link out of the root, a
// 1 GiB os-release and a directory in its place.
func TestOSReleaseAsTheGuestReadsIt(t *testing.T) {
	want := api.GuestOS{ID: "debian", VersionID: "12", PrettyName: "Debian GNU/Linux 12 (bookworm)"}
	for name, setup := range map[string]func(root string){
		"relative link": func(root string) {
			write(t, root+"/usr/lib/os-release", debian)
			symlink(t, "../usr/lib/os-release", root+"/etc/os-release")
		},
		"absolute link through a linked directory": func(root string) {
			write(t, root+"/usr/lib/os-release", debian)
			symlink(t, "usr/lib", root+"/lib")
			symlink(t, "/lib/os-release", root+"/etc/os-release")
		},
		"no /etc/os-release": func(root string) { write(t, root+"/usr/lib/os-release", debian) },
		"dotdot past the root stays in it": func(root string) {
			write(t, root+"/usr/lib/os-release", debian)
			symlink(t, "../../../../../usr/lib/os-release", root+"/etc/os-release")
		},
	} {
		t.Run(name, func(t *testing.T) {
			rel, err := openGuest(t, setup)
			if err != nil || *rel != want {
				t.Errorf("%+v, %v; want %+v", rel, err, want)
			}
		})
	}
	for name, setup := range map[string]func(root string){
		"link loop": func(root string) {
			symlink(t, "b", root+"/etc/a")
			symlink(t, "a", root+"/etc/b")
			symlink(t, "a", root+"/etc/os-release")
		},
		"1 GiB os-release": func(root string) {
			write(t, root+"/etc/os-release", debian)
			if err := os.Truncate(root+"/etc/os-release", 1<<30); err != nil {
				t.Fatal(err)
			}
		},
		"a directory": func(root string) {
			if err := os.MkdirAll(root+"/etc/os-release", 0o755); err != nil {
				t.Fatal(err)
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			rel, err := openGuest(t, setup)
			if err == nil {
				t.Errorf("read %+v; want an error", rel)
			}
			if name == "1 GiB os-release" && !errors.Is(err, ErrTooLarge) {
				t.Errorf("%v; want ErrTooLarge", err)
			}
		})
	}
}
