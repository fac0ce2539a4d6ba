package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"

	"github.com/imagepipe/imagepipe/test/harness"
)

// runner is the harness.T that lets the demo program use test/harness outside `go test`:
// Helper, Name, Context, Cleanup, TempDir, Log(f), Error(f), Fatal(f) and Failed, plus Skip,
// which need calls for a missing tool.
//
// As in package testing, Fatal and Skip end the calling goroutine with runtime.Goexit: run
// the demo in a goroutine of its own (run does), and cleanups run after it, last registered
// first, each in its own goroutine.
//
// A compiled test binary would own the terminal as well, but it would end with the testing
// package's PASS or FAIL, print the servers' log tails on an interrupt, and exit 0 when a tool
// is missing (a skip); with a runner the program says what happened instead, and exits 1 when
// it cannot run.
type runner struct {
	ctx  context.Context
	logs io.Writer // Log and Logf output: the tails of component logs the harness prints on failure

	mu       sync.Mutex
	cleanups []func()
	failed   bool
	skipped  bool
	tempBase string
	tempSeq  int
}

var _ harness.T = (*runner)(nil)

// newRunner returns a runner whose Context is ctx and whose Log output goes to logs.
func newRunner(ctx context.Context, logs io.Writer) *runner {
	return &runner{ctx: ctx, logs: logs}
}

// run calls f(r) in a new goroutine, waits for it to return or to end through Fatal or Skip,
// then runs the cleanups. It reports whether f failed and whether it skipped.
func (r *runner) run(f func(harness.T)) (failed, skipped bool) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	for {
		r.mu.Lock()
		n := len(r.cleanups)
		if n == 0 {
			r.mu.Unlock()
			break
		}
		c := r.cleanups[n-1]
		r.cleanups = r.cleanups[:n-1]
		r.mu.Unlock()
		cleanupDone := make(chan struct{})
		go func() {
			defer close(cleanupDone)
			c()
		}()
		<-cleanupDone
	}
	return r.Failed(), r.Skipped()
}

func (r *runner) Helper()                  {}
func (r *runner) Name() string             { return "demo" }
func (r *runner) Context() context.Context { return r.ctx }
func (r *runner) Output() io.Writer        { return r.logs }

func (r *runner) Cleanup(f func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cleanups = append(r.cleanups, f)
}

// TempDir returns a new directory under one base directory, which a cleanup registered with the
// first call removes, after every cleanup registered later.
func (r *runner) TempDir() string {
	r.mu.Lock()
	first := r.tempBase == ""
	if first {
		base, err := os.MkdirTemp("", "imagepipe-demo-")
		if err != nil {
			r.mu.Unlock()
			r.Fatalf("making a temporary directory: %v", err)
		}
		r.tempBase = base
	}
	r.tempSeq++
	dir := filepath.Join(r.tempBase, strconv.Itoa(r.tempSeq))
	base := r.tempBase
	r.mu.Unlock()
	if first {
		r.Cleanup(func() { _ = os.RemoveAll(base) })
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		r.Fatalf("making a temporary directory: %v", err)
	}
	return dir
}

func (r *runner) Log(args ...any) { fmt.Fprintln(r.logs, args...) }
func (r *runner) Logf(format string, args ...any) {
	fmt.Fprintf(r.logs, format+"\n", args...)
}

func (r *runner) Fail() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed = true
}

func (r *runner) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

func (r *runner) Skipped() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.skipped
}

// Error reports a failure on stderr; the demo goes on.
func (r *runner) Error(args ...any) { r.report(fmt.Sprint(args...)); r.Fail() }
func (r *runner) Errorf(format string, args ...any) {
	r.report(fmt.Sprintf(format, args...))
	r.Fail()
}

// Fatal reports a failure on stderr and ends the demo's goroutine.
func (r *runner) Fatal(args ...any) { r.Error(args...); r.FailNow() }
func (r *runner) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	r.FailNow()
}
func (r *runner) FailNow() { r.Fail(); runtime.Goexit() }

// Skip is what the harness calls when a tool is missing; the demo cannot run without it.
func (r *runner) Skip(args ...any) { r.report(fmt.Sprint(args...)); r.SkipNow() }
func (r *runner) Skipf(format string, args ...any) {
	r.report(fmt.Sprintf(format, args...))
	r.SkipNow()
}
func (r *runner) SkipNow() {
	r.mu.Lock()
	r.skipped = true
	r.mu.Unlock()
	runtime.Goexit()
}

// report prints a failure, unless the demo was interrupted: then every failure is a
// consequence of the interruption, which main reports once.
func (r *runner) report(msg string) {
	if r.ctx.Err() != nil {
		fmt.Fprintln(r.logs, msg)
		return
	}
	fmt.Fprintln(os.Stderr, "demo: "+msg)
}
