// Package need is how a test asks for what it runs against: a program on
// PATH, root, a tool built by `make tools`. When a need is not met the test
// skips, so that `go test` still works on a bare machine. `make test` and CI
// pipe `go test -json` through hack/testreport, which fails the run on any
// skip whose message does not start with AllowedPrefix and a key of
// Allowed: there, a missing install, privilege or server is a failure.
//
// Only this package calls testing's Skip methods (need_test.go checks the
// module for others).
package need

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// T is the part of testing.TB this package uses.
type T interface {
	Helper()
	Skip(args ...any)
}

// Allowed are the only reasons a test may skip under `make test` and CI,
// by key. Keep it short: every entry is a test that CI does not run.
var Allowed = map[string]string{
	"opt-in":     "a test that runs only when its environment variable is set: benchmarks, rewriting fuzz seeds",
	"in-cluster": "a kubeconfig test on a machine with a Kubernetes service account, whose in-cluster config would hide the order under test",
}

// AllowedPrefix starts the message of every allowed skip; the key in
// Allowed follows, then "): " and the reason.
const AllowedPrefix = "allowed skip ("

// Programs are the programs tests run, each with the Debian package that
// test/tools.sh installs for it (need_test.go checks that it does).
var Programs = map[string]string{
	"/usr/bin/time":      "time",
	"dpkg-query":         "dpkg",
	"gzip":               "gzip",
	"hivexsh":            "libhivex-bin",
	"ip":                 "iproute2",
	"losetup":            "mount",
	"lvm":                "lvm2",
	"make":               "make",
	"mcopy":              "mtools",
	"mkfs.btrfs":         "btrfs-progs",
	"mkfs.ext4":          "e2fsprogs",
	"mkfs.fat":           "dosfstools",
	"mkfs.xfs":           "xfsprogs",
	"mkntfs":             "ntfs-3g",
	"mkswap":             "util-linux",
	"mmd":                "mtools",
	"mount":              "mount",
	"ntfs-3g":            "ntfs-3g",
	"prlimit":            "util-linux",
	"pvcreate":           "lvm2",
	"qemu-img":           "qemu-utils",
	"qemu-io":            "qemu-utils",
	"qemu-system-x86_64": "qemu-system-x86",
	"rpm":                "rpm",
	"rpmbuild":           "rpm",
	"sfdisk":             "fdisk",
	"sgdisk":             "gdisk",
	"skopeo":             "skopeo",
	"socat":              "socat",
	"sqlite3":            "sqlite3",
	"umount":             "mount",
	"unshare":            "util-linux",
	"xfs_db":             "xfsprogs",
	"xorrisofs":          "xorriso",
	"xorriso":            "xorriso",
	"xz":                 "xz-utils",
	"zstd":               "zstd",
}

// Program returns the path of the program name (a key of Programs) on
// PATH, or skips the test.
func Program(t T, name string) string {
	t.Helper()
	pkg, ok := Programs[name]
	if !ok {
		panic(fmt.Sprintf("need.Program: %q is not in need.Programs", name))
	}
	path, err := exec.LookPath(name)
	if err != nil {
		Missing(t, "%s is not installed (make tools installs the Debian package %s)", name, pkg)
	}
	return path
}

// BuiltDir is where test/buildtools.sh puts the tools `make tools`
// builds: $IMAGEPIPE_BIN, else $IMAGEPIPE_CACHE/bin, else
// $HOME/.cache/imagepipe/bin.
func BuiltDir() string {
	if dir := os.Getenv("IMAGEPIPE_BIN"); dir != "" {
		return dir
	}
	if cache := os.Getenv("IMAGEPIPE_CACHE"); cache != "" {
		return filepath.Join(cache, "bin")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		home = os.TempDir()
	}
	return filepath.Join(home, ".cache", "imagepipe", "bin")
}

// Built returns the path of the tool name that `make tools` builds into
// BuiltDir, or skips the test.
func Built(t T, name string) string {
	t.Helper()
	path := filepath.Join(BuiltDir(), name)
	if fi, err := os.Stat(path); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
		Missing(t, "%s is not built in %s: run make tools", name, BuiltDir())
	}
	return path
}

// Guests returns the directory of the guests test/guests.sh built for this
// checkout and this machine's Debian package versions (`make tools`), or
// skips the test. It fails the test when the script cannot say where.
func Guests(t interface {
	T
	Fatalf(format string, args ...any)
}) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatalf("%v", err)
	}
	script := ""
	for d := wd; script == ""; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			script = filepath.Join(d, "test", "guests.sh")
		} else if filepath.Dir(d) == d {
			t.Fatalf("no go.mod at or above %s", wd)
		}
	}
	out, err := exec.Command("bash", script, "--dir").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("test/guests.sh --dir: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("test/guests.sh --dir: %v", err)
	}
	dir := strings.TrimSpace(string(out))
	if _, err := os.Stat(filepath.Join(dir, "versions")); err != nil {
		Missing(t, "the test guests are not built in %s: run make tools (test/guests.sh)", dir)
	}
	return dir
}

// QEMUUser is the user a test runs QEMU as: nobody when the test runs as
// root (as the gate does, QEMU is never run as root; prlimit, which then
// bounds it, is needed), else nil, the test's own user.
func QEMUUser(t T) *syscall.Credential {
	t.Helper()
	if os.Geteuid() != 0 {
		return nil
	}
	Program(t, "prlimit")
	return &syscall.Credential{Uid: 65534, Gid: 65534}
}

// ReachableTempDir is a TempDir of the test that QEMUUser's user may
// enter, as may the folder above it.
func ReachableTempDir(t interface {
	T
	TempDir() string
	Fatalf(format string, args ...any)
}) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatalf("%v", err)
		}
	}
	return dir
}

// Root skips the test unless it runs as root; why says what needs it.
func Root(t T, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		Missing(t, "needs root: %s", why)
	}
}

// Missing skips the test for a need that is not met. Under `make test` and
// CI the skip fails the run.
func Missing(t T, format string, args ...any) {
	t.Helper()
	t.Skip("missing: " + fmt.Sprintf(format, args...))
}

// OptIn skips the test unless the environment variable env is set to a
// non-empty value; what says what the test does when it runs.
func OptIn(t T, env, what string) {
	t.Helper()
	if os.Getenv(env) == "" {
		Allow(t, "opt-in", "set %s=1 to %s", env, what)
	}
}

// Allow skips the test for one of the Allowed reasons.
func Allow(t T, key, format string, args ...any) {
	t.Helper()
	if _, ok := Allowed[key]; !ok {
		panic(fmt.Sprintf("need.Allow: %q is not in need.Allowed", key))
	}
	t.Skip(AllowedPrefix + key + "): " + fmt.Sprintf(format, args...))
}

// IsAllowed reports whether a skip message is one of the Allowed reasons.
func IsAllowed(msg string) bool {
	rest, ok := strings.CutPrefix(strings.TrimSpace(msg), AllowedPrefix)
	if !ok {
		return false
	}
	key, _, ok := strings.Cut(rest, "): ")
	_, known := Allowed[key]
	return ok && known
}
