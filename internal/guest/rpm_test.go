package guest

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/imagepipe/imagepipe/internal/need"
)

// rpmSpec is a package rpmbuild makes: its epoch (none when ""), its
// arch, and a description of descSize bytes (a large one puts the
// header on SQLite overflow pages).
type rpmSpec struct {
	name, epoch, version, release, arch string
	descSize                            int
}

// buildRPM makes the package with rpmbuild and returns its path.
func buildRPM(t *testing.T, s rpmSpec) string {
	t.Helper()
	top := t.TempDir()
	spec := fmt.Sprintf("Name: %s\nVersion: %s\nRelease: %s\nSummary: a test package\nLicense: MIT\nBuildArch: %s\n", s.name, s.version, s.release, s.arch)
	if s.epoch != "" {
		spec += "Epoch: " + s.epoch + "\n"
	}
	spec += "%description\n" + strings.Repeat("a test package\n", s.descSize/15+1) + "%files\n"
	write(t, top+"/a.spec", spec)
	run(t, "rpmbuild", "--quiet", "-bb", "--define", "_topdir "+top, "--define", "_build_id_links none", top+"/a.spec")
	rpms, _ := filepath.Glob(top + "/RPMS/*/*.rpm")
	if len(rpms) != 1 {
		t.Fatalf("rpmbuild made %q", rpms)
	}
	return rpms[0]
}

// rpmQA is what rpm -qa says of the database in dbpath under root, one
// "name epoch version-release arch" per package (epoch "(none)" when it
// has none), sorted; extra are more rpm options (a backend).
func rpmQA(t *testing.T, root, dbpath string, extra ...string) []string {
	t.Helper()
	args := append([]string{"--root", root, "--dbpath", dbpath}, extra...)
	args = append(args, "-qa", "--qf", "%{NAME} %{EPOCH} %{VERSION}-%{RELEASE} %{ARCH}\n")
	out, err := exec.Command(need.Program(t, "rpm"), args...).Output()
	if err != nil {
		t.Fatalf("rpm -qa: %v", err)
	}
	var lines []string
	for l := range strings.Lines(string(out)) {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "gpg-pubkey ") {
			lines = append(lines, l)
		}
	}
	slices.Sort(lines)
	return lines
}

// rpmLines are pkgs as rpmQA prints them.
func rpmLines(pkgs []Package) []string {
	var lines []string
	for _, p := range pkgs {
		epoch := p.Epoch
		if epoch == "" {
			epoch = "(none)"
		}
		arch := p.Arch
		if arch == "" {
			arch = "(none)"
		}
		lines = append(lines, fmt.Sprintf("%s %s %s %s", p.Name, epoch, p.Version, arch))
	}
	slices.Sort(lines)
	return lines
}

// TestRPMAsRPMSaysIt: the packages rpm 4.18 installed (--justdb) into
// its sqlite database under /var/lib/rpm and /usr/lib/sysimage/rpm,
// read as rpm -qa lists them: with and without an epoch, noarch, and one
// whose header continues on SQLite overflow pages.
func TestRPMAsRPMSaysIt(t *testing.T) {
	specs := []rpmSpec{
		{"hello-guest", "2", "1.2.3", "4.el9", "x86_64", 0},
		{"tzdata-like", "", "2024a", "1.fc40", "noarch", 0},
		{"big-header", "", "0.1", "1", "x86_64", 200 << 10},
	}
	var rpms []string
	for _, s := range specs {
		rpms = append(rpms, buildRPM(t, s))
	}
	for _, dbpath := range []string{"/var/lib/rpm", "/usr/lib/sysimage/rpm"} {
		t.Run(dbpath, func(t *testing.T) {
			root := t.TempDir()
			run(t, "rpm", "--root", root, "--dbpath", dbpath, "--initdb")
			run(t, "rpm", append([]string{"--root", root, "--dbpath", dbpath, "-i", "--nodeps", "--justdb"}, rpms...)...)
			want := rpmQA(t, root, dbpath)
			if len(want) != len(specs) {
				t.Fatalf("rpm -qa lists %q", want)
			}
			pkgs, err := ReadRPM(os.DirFS(root))
			if err != nil {
				t.Fatal(err)
			}
			if got := rpmLines(pkgs); !slices.Equal(got, want) {
				t.Errorf("read %q;\nrpm -qa says %q", got, want)
			}
			if pkgs[0].Type != "rpm" {
				t.Errorf("type %q", pkgs[0].Type)
			}
		})
	}
}

// goRPMDBTestdata is the directory of the databases go-rpmdb v0.1.1 tests
// with, made by the distributions' own rpm (CentOS 7's Berkeley DB, an
// s390x UBI 8's big-endian one, SLES 15's ndb, Fedora 35's sqlite),
// fetched through the Go module proxy.
func goRPMDBTestdata(t testing.TB) string {
	t.Helper()
	out, err := exec.Command("go", "mod", "download", "-json", "github.com/knqyf263/go-rpmdb@v0.1.1").Output()
	if err != nil {
		t.Fatalf("go mod download github.com/knqyf263/go-rpmdb@v0.1.1: %v", err)
	}
	var m struct{ Dir string }
	if err := json.Unmarshal(out, &m); err != nil || m.Dir == "" {
		t.Fatalf("%s: %v", out, err)
	}
	return filepath.Join(m.Dir, "pkg", "testdata")
}

// copyDB puts the database file src at path (absolute in the guest)
// under a new root.
func copyDB(t *testing.T, src, path string) string {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	write(t, root+path, string(b))
	return root
}

// TestRPMDistributionsDatabases: Berkeley DB databases (CentOS 7,
// big-endian UBI 8 on s390x) and Fedora 35's sqlite one read as rpm 4.18
// lists them (bdb_ro is its read-only Berkeley DB backend); SLES 15's
// ndb database, which Debian's rpm cannot read, as go-rpmdb's own test
// expects it.
func TestRPMDistributionsDatabases(t *testing.T) {
	td := goRPMDBTestdata(t)
	for _, tc := range []struct{ name, file, path, backend string }{
		{"centos7 bdb", "centos7-plain/Packages", "/var/lib/rpm/Packages", "bdb_ro"},
		{"ubi8 s390x bdb", "ubi8-s390x/Packages", "/var/lib/rpm/Packages", "bdb_ro"},
		{"fedora35 sqlite", "fedora35/rpmdb.sqlite", "/usr/lib/sysimage/rpm/rpmdb.sqlite", "sqlite"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := copyDB(t, filepath.Join(td, tc.file), tc.path)
			want := rpmQA(t, root, filepath.Dir(tc.path), "--define", "_db_backend "+tc.backend)
			pkgs, err := ReadRPM(os.DirFS(root))
			if err != nil {
				t.Fatal(err)
			}
			if got := rpmLines(pkgs); !slices.Equal(got, want) || len(want) < 50 {
				t.Errorf("read %d packages, rpm -qa %d: first differences %q", len(got), len(want), firstDiff(got, want))
			}
		})
	}
	t.Run("sles15 ndb", func(t *testing.T) {
		root := copyDB(t, filepath.Join(td, "sle15-bci/Packages.db"), "/usr/lib/sysimage/rpm/Packages.db")
		pkgs, err := ReadRPM(os.DirFS(root))
		if err != nil {
			t.Fatal(err)
		}
		src, err := os.ReadFile(filepath.Join(td, "..", "rpmdb_testcase_test.go"))
		if err != nil {
			t.Fatal(err)
		}
		// go-rpmdb's expected list: {intRef(epoch?), "name", "version", "release", "arch", ...}
		block := string(src[strings.Index(string(src), "SLE15WithNDB = func"):])
		block = block[:strings.Index(block, "\n\t}\n")]
		var want []string
		for _, m := range regexp.MustCompile(`\{intRef\((\d*)\), "([^"]+)", "([^"]+)", "([^"]+)", "([^"]+)"`).FindAllStringSubmatch(block, -1) {
			epoch := m[1]
			if epoch == "" {
				epoch = "(none)"
			}
			want = append(want, fmt.Sprintf("%s %s %s-%s %s", m[2], epoch, m[3], m[4], m[5]))
		}
		slices.Sort(want)
		if got := rpmLines(pkgs); !slices.Equal(got, want) || len(want) < 20 {
			t.Errorf("read %d packages, go-rpmdb expects %d: first differences %q", len(got), len(want), firstDiff(got, want))
		}
	})
}

func firstDiff(a, b []string) []string {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return []string{a[i], b[i]}
		}
	}
	return nil
}

// TestRPMHostileDatabases: a database over its bound, a truncated one,
// a SQLite B-tree whose page points at itself and a BDB overflow chain
// that loops are errors, and no database is ErrNoDatabase.
func TestRPMHostileDatabases(t *testing.T) {
	if _, err := ReadRPM(os.DirFS(t.TempDir())); !errors.Is(err, ErrNoDatabase) {
		t.Errorf("no database: %v", err)
	}
	td := goRPMDBTestdata(t)
	sqlite, err := os.ReadFile(filepath.Join(td, "fedora35/rpmdb.sqlite"))
	if err != nil {
		t.Fatal(err)
	}
	bdb, err := os.ReadFile(filepath.Join(td, "centos7-plain/Packages"))
	if err != nil {
		t.Fatal(err)
	}
	// An interior page's right-most child made the page itself.
	selfRef := slices.Clone(sqlite)
	ps := 4096
	for n := 1; n*ps < len(selfRef); n++ {
		if selfRef[(n)*ps] == 0x05 {
			copy(selfRef[n*ps+8:], []byte{0, 0, byte((n + 1) >> 8), byte(n + 1)})
			break
		}
	}
	// Every overflow page's next page made itself.
	loop := slices.Clone(bdb)
	for n := 1; (n+1)*ps <= len(loop); n++ {
		if loop[n*ps+25] == 7 && loop[n*ps+22]|loop[n*ps+23] != 0 {
			copy(loop[n*ps+16:], []byte{byte(n), byte(n >> 8), byte(n >> 16), 0})
			// a chain ends at the page's own bytes, so the length still asks for more
		}
	}
	for name, tc := range map[string]struct {
		b    []byte
		path string
		want error
	}{
		"sqlite over its bound": {nil, "/usr/lib/sysimage/rpm/rpmdb.sqlite", ErrTooLarge},
		"truncated sqlite":      {sqlite[:len(sqlite)/2], "/usr/lib/sysimage/rpm/rpmdb.sqlite", nil},
		"sqlite page cycle":     {selfRef, "/usr/lib/sysimage/rpm/rpmdb.sqlite", nil},
		"bdb overflow loop":     {loop, "/var/lib/rpm/Packages", nil},
		"truncated bdb":         {bdb[:len(bdb)/3], "/var/lib/rpm/Packages", nil},
	} {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			write(t, root+tc.path, string(tc.b))
			if tc.b == nil { // sparse, of a size over the bound
				if err := os.Truncate(root+tc.path, maxRPMDB+1); err != nil {
					t.Fatal(err)
				}
			}
			pkgs, err := ReadRPM(os.DirFS(root))
			t.Log(err)
			if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Errorf("%d packages, %v; want an error (%v)", len(pkgs), err, tc.want)
			}
		})
	}
}

// TestInspectAnRPMGuestOnXFS: a root as RHEL 9 lays it out (XFS, rpm's
// sqlite database in /usr/lib/sysimage/rpm and /var/lib/rpm linked to
// it) gives the OS and as many packages as rpm -qa lists.
func TestInspectAnRPMGuestOnXFS(t *testing.T) {
	rpms := []string{
		buildRPM(t, rpmSpec{"hello-guest", "2", "1.2.3", "4.el9", "x86_64", 0}),
		buildRPM(t, rpmSpec{"tzdata-like", "", "2024a", "1.el9", "noarch", 0}),
	}
	rootfs := xfsImage(t, func(root string) {
		run(t, "rpm", "--root", root, "--dbpath", "/usr/lib/sysimage/rpm", "--initdb")
		run(t, "rpm", append([]string{"--root", root, "--dbpath", "/usr/lib/sysimage/rpm", "-i", "--nodeps", "--justdb"}, rpms...)...)
		symlink(t, "../../usr/lib/sysimage/rpm", root+"/var/lib/rpm")
		write(t, root+"/etc/os-release", "ID=rhel\nVERSION_ID=9.4\nPRETTY_NAME=\"Red Hat Enterprise Linux 9.4 (Plow)\"\n")
	})
	f, err := os.Open(rootfs)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rep := Inspect(f, 320*mib)
	if rep.OS == nil || rep.OS.ID != "rhel" || rep.Packages == nil || rep.Packages.Manager != "rpm" || rep.Packages.Count != 2 {
		t.Errorf("os %+v, packages %+v, notes %q", rep.OS, rep.Packages, rep.Notes)
	}
}
