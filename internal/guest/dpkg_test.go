package guest

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/imagepipe/imagepipe/internal/need"
)

// TestDpkgAsDpkgSaysIt: the status file dpkg wrote on this Debian
// machine, in a guest filesystem made by mkfs.ext4 -d, lists what
// dpkg-query lists as installed, name, version and architecture.
func TestDpkgAsDpkgSaysIt(t *testing.T) {
	status, err := os.ReadFile("/var/lib/dpkg/status")
	if err != nil {
		t.Fatalf("%v (the tests run on Debian)", err)
	}
	out, err := exec.Command(need.Program(t, "dpkg-query"), "-W", "-f", "${db:Status-Abbrev}|${Package}|${Version}|${Architecture}\n").Output()
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f := strings.Split(l, "|"); len(f) == 4 && strings.TrimSpace(f[0]) == "ii" {
			want = append(want, f[1]+" "+f[2]+" "+f[3])
		}
	}
	// A package removed with its configuration kept ("rc"), as dpkg
	// writes it, is not installed.
	status = append(status, "\nPackage: gone\nStatus: deinstall ok config-files\nPriority: optional\nArchitecture: amd64\nVersion: 1.0-1\nConffiles:\n /etc/gone.conf 0123456789abcdef0123456789abcdef\n"...)
	fsys := openTree(t, func(root string) { write(t, root+"/var/lib/dpkg/status", string(status)) })
	pkgs, err := ReadDpkg(fsys)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range pkgs {
		got = append(got, p.Name+" "+p.Version+" "+p.Arch)
	}
	slices.Sort(got)
	slices.Sort(want)
	if len(want) < 100 || !slices.Equal(got, want) {
		t.Errorf("%d packages read, dpkg-query lists %d installed", len(got), len(want))
	}

	if _, err := ReadDpkg(openTree(t, func(root string) { write(t, root+"/etc/hostname", "x") })); err != ErrNoDatabase {
		t.Errorf("a guest without dpkg: %v; want ErrNoDatabase", err)
	}
}
