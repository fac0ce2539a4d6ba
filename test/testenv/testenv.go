// Package testenv gives imagepipe's integration tests the binaries under
// test and the real tools they compare against (qemu-img, qemu-io).
package testenv

import (
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/imagepipe/imagepipe/internal/need"
	"github.com/imagepipe/imagepipe/test/harness"
)

// Imagectl is the imagectl binary under test, set by Main.
var Imagectl string

// ImageSyncer is the image-syncer binary under test, set by MainWithSyncer.
var ImageSyncer string

// ImageGate is the image-gate binary under test, set by MainWithSyncer
// and MainWithGate: no syncer imports anything without it.
var ImageGate string

// Main runs a test package's tests with Imagectl set: $IMAGECTL when the
// Makefile built it, else a fresh build into a temporary directory.
func Main(m *testing.M) int {
	path, cleanup, err := command("IMAGECTL", "imagectl")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer cleanup()
	Imagectl = path
	return m.Run()
}

// MainWithGate is Main with ImageGate set too: $IMAGE_GATE, else a fresh
// build.
func MainWithGate(m *testing.M) int {
	gate, cleanup, err := command("IMAGE_GATE", "image-gate")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer cleanup()
	ImageGate = gate
	return Main(m)
}

// MainWithSyncer is Main with ImageSyncer and ImageGate set too:
// $IMAGE_SYNCER and $IMAGE_GATE, else fresh builds.
func MainWithSyncer(m *testing.M) int {
	path, cleanup, err := command("IMAGE_SYNCER", "image-syncer")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer cleanup()
	ImageSyncer = path
	gate, cleanupGate, err := command("IMAGE_GATE", "image-gate")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer cleanupGate()
	ImageGate = gate
	return Main(m)
}

// command returns the binary of cmd/NAME: the path in $envVar, or a build
// into a temporary directory that cleanup removes.
func command(envVar, name string) (path string, cleanup func(), err error) {
	if path = os.Getenv(envVar); path != "" {
		return path, func() {}, nil
	}
	dir, err := os.MkdirTemp("", name+"-bin-")
	if err != nil {
		return "", nil, err
	}
	path = filepath.Join(dir, name)
	build := exec.Command("go", "build", "-o", path, "github.com/imagepipe/imagepipe/cmd/"+name)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("building %s: %w", name, err)
	}
	return path, func() { os.RemoveAll(dir) }, nil
}

// RequireQEMU skips the test when the oracle is missing; `make tools`
// installs it (Debian package qemu-utils).
func RequireQEMU(t *testing.T) {
	t.Helper()
	for _, tool := range []string{"qemu-img", "qemu-io"} {
		need.Program(t, tool)
	}
}

// Run runs a command, fails the test unless it exits 0, and returns its
// combined output.
func Run(t *testing.T, name string, args ...string) []byte {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

// Exit runs a command and returns its exit code, stdout and stderr.
func Exit(t *testing.T, name string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e strings.Builder
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), o.String(), e.String()
	}
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return 0, o.String(), e.String()
}

// Command describes one run of a program: its arguments, extra environment
// and standard input.
type Command struct {
	Name  string
	Args  []string
	Env   []string // added to the test's environment
	Stdin string
}

// Result is how a Command ended.
type Result struct {
	Code           int
	Stdout, Stderr string
}

// RunCommand runs c and returns its exit code and output; only a failure to
// start it fails the test.
func RunCommand(t harness.T, c Command) Result {
	t.Helper()
	var o, e strings.Builder
	cmd := exec.Command(c.Name, c.Args...)
	cmd.Env = append(os.Environ(), c.Env...)
	cmd.Stdin = strings.NewReader(c.Stdin)
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return Result{ee.ExitCode(), o.String(), e.String()}
	}
	if err != nil {
		t.Fatalf("%s: %v", c.Name, err)
	}
	return Result{0, o.String(), e.String()}
}

// CorruptLastCompressedCluster overwrites the start of the last compressed
// cluster that the first L2 table of a qcow2 image (64 KiB clusters) maps
// with 0xff bytes, so that the image is only found broken while its data is
// read.
func CorruptLastCompressedCluster(t *testing.T, path string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	u64 := func(off uint64) uint64 {
		var b [8]byte
		if _, err := f.ReadAt(b[:], int64(off)); err != nil {
			t.Fatal(err)
		}
		return binary.BigEndian.Uint64(b[:])
	}
	if bits := u64(16) & 0xffffffff; bits != 16 {
		t.Fatalf("cluster_bits %d; this helper handles 64 KiB clusters", bits)
	}
	l2 := u64(u64(40)) & 0x00fffffffffffe00
	var host uint64
	for i := range uint64(8192) {
		if e := u64(l2 + i*8); e&(1<<62) != 0 {
			host = e & (1<<54 - 1) // 64 KiB clusters: the offset is bits 0..53
		}
	}
	if host == 0 {
		t.Fatal("no compressed cluster found")
	}
	if _, err := f.WriteAt([]byte(strings.Repeat("\xff", 64)), int64(host)); err != nil {
		t.Fatal(err)
	}
}

// Entries lists the names in a directory.
func Entries(t *testing.T, dir string) []string {
	t.Helper()
	des, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range des {
		names = append(names, d.Name())
	}
	return names
}

// RunImagectl runs the imagectl under test with a private cache
// (IMAGEPIPE_CACHE in a temporary directory) and returns how it ended.
func RunImagectl(t *testing.T, args ...string) Result {
	t.Helper()
	return RunCommand(t, Command{Name: Imagectl, Args: args, Env: []string{"IMAGEPIPE_CACHE=" + t.TempDir()}})
}

// RunImagectlOK runs imagectl like RunImagectl and fails the test unless
// it exits 0.
func RunImagectlOK(t *testing.T, args ...string) Result {
	t.Helper()
	r := RunImagectl(t, args...)
	if r.Code != 0 {
		t.Fatalf("imagectl %s: exit %d\n%s", strings.Join(args, " "), r.Code, r.Stderr)
	}
	return r
}
