package cli

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"

	"github.com/imagepipe/imagepipe/internal/need"
)

// ptyRun is how a run under a pseudo-terminal ended.
type ptyRun struct {
	code           int
	stdout, stderr string // stderr is what the terminal showed when it was one
	timedOut       bool
}

// runOnTerminal runs imagectl with standard input, standard error or both
// on a fresh pseudo-terminal (the others are pipes, standard input empty),
// as in an interactive shell. A run still going after limit is killed and
// reported as timed out.
func runOnTerminal(t *testing.T, stdinTTY, stderrTTY bool, limit time.Duration, args ...string) ptyRun {
	t.Helper()
	ptmx, tty, err := pty.Open()
	if err != nil {
		need.Missing(t, "a pseudo-terminal: %v", err)
	}
	defer ptmx.Close()
	ctx, cancel := context.WithTimeout(t.Context(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, testenv.Imagectl, args...)
	cmd.Env = append(os.Environ(), "IMAGEPIPE_CACHE="+t.TempDir(), "DOCKER_CONFIG="+t.TempDir())
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr, cmd.Stdin = &stdout, &stderr, strings.NewReader("")
	if stdinTTY {
		cmd.Stdin = tty
	}
	if stderrTTY {
		cmd.Stderr = tty
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	tty.Close() // the child holds it now; reading ptmx ends once it exits
	shown := make(chan []byte)
	go func() {
		var b bytes.Buffer
		_, _ = io.Copy(&b, ptmx) // ends with EIO when the last holder of tty closes it
		shown <- b.Bytes()
	}()
	err = cmd.Wait()
	r := ptyRun{stdout: stdout.String(), stderr: stderr.String(), timedOut: ctx.Err() != nil}
	ptmx.SetReadDeadline(time.Now().Add(5 * time.Second))
	if b := <-shown; stderrTTY {
		r.stderr = string(b)
	}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	return r
}

// TestStdinOnTerminalRefused: "-" as the source, typed in a shell without
// a pipe, fails at once saying how to pipe the image in, instead of
// waiting for input that never comes.
func TestStdinOnTerminalRefused(t *testing.T) {
	for _, args := range [][]string{
		{"import", "-", "127.0.0.1:1/acme/disk:1"},
		{"inspect", "-"},
		{"convert", "-", filepath.Join(t.TempDir(), "out.qcow2")},
	} {
		t.Run(args[0], func(t *testing.T) {
			r := runOnTerminal(t, true, false, 30*time.Second, args...)
			if r.timedOut {
				t.Fatal("still waiting for standard input after 30s")
			}
			if r.code != 1 || !strings.Contains(r.stderr, "standard input, which is a terminal") ||
				!strings.Contains(r.stderr, "imagectl "+args[0]+" - ... < disk.qcow2") {
				t.Errorf("exit %d, stderr:\n%s", r.code, r.stderr)
			}
		})
	}
	// A pipe on standard input is still read.
	testenv.RequireQEMU(t)
	disk := validQCOW2(t, t.TempDir(), false)
	data, err := os.ReadFile(disk)
	if err != nil {
		t.Fatal(err)
	}
	r := testenv.RunCommand(t, testenv.Command{Name: testenv.Imagectl, Args: []string{"inspect", "-"}, Stdin: string(data)})
	if r.Code != 0 || !strings.Contains(r.Stdout, "qcow2") {
		t.Errorf("inspect - from a pipe: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
}

// TestPasswordStdinWithStdinSource: the password and the image cannot both
// come from standard input.
func TestPasswordStdinWithStdinSource(t *testing.T) {
	r := testenv.RunCommand(t, testenv.Command{
		Name:  testenv.Imagectl,
		Args:  []string{"import", "-", "127.0.0.1:1/acme/disk:1", "--username", "u", "--password-stdin"},
		Stdin: "secret\nimage bytes",
	})
	if r.Code != 1 || !strings.Contains(r.Stderr, "both read standard input") {
		t.Errorf("exit %d, stderr:\n%s", r.Code, r.Stderr)
	}
}

// TestProgressBarsOnTerminalOnly: convert, export and copy draw a progress
// bar on standard error when it is a terminal, ending in a last line that
// says 100%; with standard error piped, or with --quiet, they draw none.
func TestProgressBarsOnTerminalOnly(t *testing.T) {
	testenv.RequireQEMU(t)
	dir := t.TempDir()
	raw := filepath.Join(dir, "disk.raw")
	testenv.Run(t, "qemu-img", "create", "-q", "-f", "raw", raw, "64M")
	testenv.Run(t, "qemu-io", "-f", "raw", "-c", "write -P 0x61 0 3M", "-c", "write -P 0x62 40M 2M", raw)
	testenv.Run(t, "gzip", "-k", raw)
	from := harness.StartRegistry(t, harness.RegistryOptions{})
	to := harness.StartRegistry(t, harness.RegistryOptions{})
	ref := from.Host + "/acme/disk:1"
	if r := testenv.RunCommand(t, testenv.Command{Name: testenv.Imagectl, Args: []string{"import", "--quiet", raw, ref}, Env: []string{"IMAGEPIPE_CACHE=" + t.TempDir()}}); r.Code != 0 {
		t.Fatalf("import: exit %d\n%s", r.Code, r.Stderr)
	}

	for _, tc := range []struct {
		name   string
		args   []string
		labels []string
	}{
		{"convert", []string{"convert", raw + ".gz", filepath.Join(dir, "out.qcow2")}, []string{"reading", "converting"}},
		{"convert to stdout", []string{"convert", "--to", "raw", raw, "-"}, []string{"converting"}},
		{"export", []string{"export", ref, filepath.Join(dir, "out.raw"), "--to", "raw"}, []string{"pulling", "converting"}},
		{"copy", []string{"copy", ref, to.Host + "/acme/disk:1"}, []string{"copying"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runOnTerminal(t, false, true, 2*time.Minute, tc.args...)
			if r.code != 0 {
				t.Fatalf("on a terminal: exit %d\n%s", r.code, r.stderr)
			}
			for _, label := range tc.labels {
				i := strings.LastIndex(r.stderr, "\r"+label)
				if i < 0 {
					t.Errorf("no %s bar on the terminal:\n%q", label, r.stderr)
					continue
				}
				// The terminal turns the bar's closing "\n" into "\r\n".
				last, _, ended := strings.Cut(r.stderr[i+1:], "\r\n")
				if !ended || !strings.Contains(last, "100%") {
					t.Errorf("the last %s bar %q does not say 100%% and end its line", label, last)
				}
			}
			if strings.Contains(tc.name, "stdout") && len(r.stdout) != 64<<20 {
				t.Errorf("stdout has %d bytes, want the 64 MiB disk", len(r.stdout))
			}

			for _, quiet := range []bool{false, true} {
				args := tc.args
				if quiet {
					args = append(args[:len(args):len(args)], "--quiet")
					r = runOnTerminal(t, false, true, 2*time.Minute, args...)
				} else {
					r = runOnTerminal(t, false, false, 2*time.Minute, args...)
				}
				if r.code != 0 {
					t.Fatalf("quiet=%v: exit %d\n%s", quiet, r.code, r.stderr)
				}
				if strings.Contains(r.stderr, "\r") || strings.Contains(r.stderr, "%") {
					t.Errorf("quiet=%v: a bar on standard error:\n%q", quiet, r.stderr)
				}
			}
		})
	}
}
