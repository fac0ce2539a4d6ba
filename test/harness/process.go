package harness

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/imagepipe/imagepipe/internal/need"
)

const (
	// stopGrace is how long a component has to exit after SIGTERM before it gets SIGKILL.
	stopGrace = 5 * time.Second
	// readyTimeout bounds how long a component may take to answer its readiness probe.
	readyTimeout = 60 * time.Second
	// startAttempts is how often a start is tried, each on fresh ports, before the test fails;
	// a retry covers the race between freePort closing its listener and the component binding.
	startAttempts = 3
	// logTailBytes is how much of a component's log is printed when a test fails.
	logTailBytes = 16 << 10
)

// BinDir is where buildtools.sh puts binaries (need.BuiltDir).
func BinDir() string { return need.BuiltDir() }

// Binary returns the path of a built tool, or skips the test (need.Missing) when it is missing.
func Binary(t T, name string) string {
	t.Helper()
	return need.Built(t, name)
}

// handedOut holds every port freePort has returned in this process: the kernel may offer a
// port again once its listener is closed, and a port reserved for a component that starts later
// (a syncer's health port, reserved before the registry that must know its webhook) would then
// go to a second component.
var handedOut sync.Map // int -> struct{}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago and that no earlier call in
// this process returned. Another process may take it before the component binds it, which is
// why starts are retried.
func freePort(t T) int {
	t.Helper()
	for range 1000 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("finding a free port: %v", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if _, taken := handedOut.LoadOrStore(port, struct{}{}); !taken {
			return port
		}
	}
	t.Fatal("finding a free port: every port offered was handed out before")
	return 0
}

// proc is one run of a component's binary, its stdout and stderr appended to a log file.
type proc struct {
	cmd    *exec.Cmd
	cancel context.CancelFunc
	done   chan struct{} // closed once the process has exited and been reaped
	err    error         // what Wait returned; read only after done is closed
}

// startProc starts bin with args and extra environment variables. Cancelling its context (stop)
// sends SIGTERM; exec's WaitDelay turns that into SIGKILL after stopGrace.
func startProc(logPath string, env []string, bin string, args ...string) (*proc, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening log: %w", err)
	}
	// The child keeps its own descriptor for the log; ours is not needed after Start.
	defer logFile.Close()

	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = sysProcAttr()
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = stopGrace
	fmt.Fprintf(logFile, "--- harness: starting %s %q\n", bin, args)
	if err := cmd.Start(); err != nil {
		cancel()
		return nil, fmt.Errorf("starting %s: %w", filepath.Base(bin), err)
	}
	p := &proc{cmd: cmd, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		p.err = cmd.Wait() // a stopped component exits by signal; its log tells the rest
	}()
	return p, nil
}

// exited reports whether the process has ended.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop ends the process with SIGTERM, then SIGKILL after stopGrace, and waits for it to be reaped.
// It fails only if the process outlives SIGKILL by stopGrace too.
func (p *proc) stop() error {
	p.cancel()
	select {
	case <-p.done:
		return nil
	case <-time.After(2*stopGrace + time.Second):
		return fmt.Errorf("pid %d did not exit after SIGTERM and SIGKILL", p.cmd.Process.Pid)
	}
}

// kill sends SIGKILL at once and waits for the process to be reaped.
func (p *proc) kill() error {
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("killing pid %d: %w", p.cmd.Process.Pid, err)
	}
	select {
	case <-p.done:
		p.cancel()
		return nil
	case <-time.After(stopGrace):
		return fmt.Errorf("pid %d did not exit after SIGKILL", p.cmd.Process.Pid)
	}
}

// errExited says the component ended before it became ready, usually because its port was taken.
var errExited = errors.New("exited before it was ready")

// waitReady polls ready every 50 ms until it reports true, the process exits, or readyTimeout.
func waitReady(p *proc, ready func(context.Context) bool) error {
	deadline := time.Now().Add(readyTimeout)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		ok := ready(ctx)
		cancel()
		if ok {
			return nil
		}
		select {
		case <-p.done:
			return errExited
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("not ready after %s", readyTimeout)
}

// httpAnswers returns a readiness check: a GET of url (with header, if not
// nil) through client answers with one of the statuses.
func httpAnswers(client *http.Client, url string, header http.Header, statuses ...int) func(context.Context) bool {
	return func(ctx context.Context) bool {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false
		}
		for k, v := range header {
			req.Header[k] = v
		}
		resp, err := client.Do(req)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return slices.Contains(statuses, resp.StatusCode)
	}
}

// logOnFailure prints the tail of a component's log when the test has failed.
func logOnFailure(t T, name, path string) {
	if !t.Failed() {
		return
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Logf("%s log %s: %v", name, path, err)
		return
	}
	if len(data) > logTailBytes {
		data = append([]byte("...\n"), data[len(data)-logTailBytes:]...)
	}
	t.Logf("%s log %s:\n%s", name, path, data)
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago, for a component a test
// starts itself; another process may take it first, so such starts should be retried.
func FreePort(t T) int { return freePort(t) }

// WaitUntil polls cond every interval until it holds, failing the test when cond errs, after
// timeout, or when the test's context ends.
func WaitUntil(t T, what string, timeout, interval time.Duration, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		select {
		case <-t.Context().Done():
			t.Fatalf("waiting for %s: %v", what, t.Context().Err())
		case <-time.After(interval):
		}
	}
}
