// Package testenv gives imagepipe's integration tests the binaries under
// test and the real tools they compare against (qemu-img, qemu-io).
package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Imagectl is the imagectl binary under test, set by Main.
var Imagectl string

// Main runs a test package's tests with Imagectl set: $IMAGECTL when the
// Makefile built it, else a fresh build into a temporary directory.
func Main(m *testing.M) int {
	Imagectl = os.Getenv("IMAGECTL")
	if Imagectl != "" {
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "imagectl-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	Imagectl = filepath.Join(dir, "imagectl")
	build := exec.Command("go", "build", "-o", Imagectl, "github.com/imagepipe/imagepipe/cmd/imagectl")
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building imagectl:", err)
		return 1
	}
	return m.Run()
}

// RequireQEMU skips the test when the oracle is missing; `make tools`
// installs it (Debian package qemu-utils).
func RequireQEMU(t *testing.T) {
	t.Helper()
	for _, tool := range []string{"qemu-img", "qemu-io"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed (make tools installs qemu-utils)", tool)
		}
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
