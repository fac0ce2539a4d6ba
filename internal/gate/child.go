package gate

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/opencontainers/go-digest"

	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// Child runs each verification in a process of its own, so that one that
// crashes or runs out of memory stops no other: the process is Path with
// Args, then --verify-temp-dir DIR; it reads its task (ReadTask: the
// subject and the subject's manifest, which the parent fetched for the
// verdict and the child does not fetch again) on its standard input,
// writes the verdict as JSON on its standard output and exits 0, or exits
// non-zero without a verdict. Each child gets a folder of
// its own under TempDir, removed when it exits however it ends, so a killed
// child leaves no spool behind. On Linux the kernel kills every child when
// the gate dies, SIGKILL included, so none outlives it; what a killed gate
// leaves in its folder the next gate removes (WorkDir).
//
// One child is kept started ahead, waiting for its subject (the spare): a
// verification then does not wait for a process to start and initialise,
// which takes a tenth of a second on a busy machine. Each child still
// verifies one subject only. Close stops the spare.
//
// A child whose resident memory passes MemoryLimit is killed (its
// resident set is read every 50 ms); children also volunteer as the
// kernel's first victims when memory runs out (see LimitSelf).
type Child struct {
	Path string
	Args []string
	// MemoryLimit is the resident memory a child may use, in bytes; 0
	// means no limit.
	MemoryLimit int64
	// TempDir holds the children's folders ("" means $TMPDIR): the gate's
	// WorkDir.
	TempDir string
	// Stderr receives the children's logs; nil discards them.
	Stderr io.Writer
	// StopGrace is how long a child may take to stop after SIGTERM when
	// the context ends, before it is killed; 0 means 10 s.
	StopGrace time.Duration
	// CPULimit is the CPU time one verification may use before the
	// kernel kills it and the image is refused (ErrCPULimit); 0 means no
	// limit.
	CPULimit time.Duration
	// Timeout is the time one verification may take before it is stopped
	// (ErrOverLimit: the image is refused after MaxOverLimit in a row); 0
	// means no limit.
	Timeout time.Duration

	mu       sync.Mutex
	spare    *childProcess
	starting bool // a spare is being started
	closed   bool
}

// ErrOverLimit is matched by Verify's error when the child was stopped
// for passing MemoryLimit or Timeout: either may be the machine's doing
// (memory or cores taken by others), so the image is refused only after
// MaxOverLimit in a row.
var ErrOverLimit = errors.New("over the verification's memory or time limit")

// ErrCrashed is matched by Verify's error when the child died of a Go
// runtime error (exit status 2: a panic nothing recovered, or a fatal
// error such as an allocation the image's bytes declared). The image is
// refused after MaxOverLimit in a row, as for ErrOverLimit, rather than
// verified again for ever.
var ErrCrashed = errors.New("the verification crashed")

// ErrCPULimit is matched by Verify's error when the child used CPULimit:
// CPU time is the image's doing, so it is refused at once.
var ErrCPULimit = errors.New("over the verification's CPU time limit")

// ExitLarge is the exit status of a child that stopped with ErrLarge: the
// image declares more than the limit it was given (Task.MaxDeclared).
const ExitLarge = 10

// exitGoRuntime is the exit status of a Go program that a runtime error
// ended.
const exitGoRuntime = 2

// maxChildVerdict bounds what a child may print: one verdict.
const maxChildVerdict = 1 << 20

// childProcess is one started child.
type childProcess struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout bytes.Buffer
	tail   *tailBuffer
	done   chan struct{} // closed once the process has been waited for
	err    error         // cmd.Wait's error, set before done is closed
}

// start starts a child, which waits for its subject.
func (c *Child) start() (*childProcess, error) {
	dir, err := os.MkdirTemp(c.TempDir, "verify-")
	if err != nil {
		return nil, fmt.Errorf("creating the verification folder: %w", err)
	}
	p := &childProcess{tail: &tailBuffer{max: 4096}, done: make(chan struct{})}
	p.cmd = exec.Command(c.Path, append(slices.Clone(c.Args), "--verify-temp-dir", dir)...)
	p.cmd.Stdout = &limitedWriter{w: &p.stdout, n: maxChildVerdict}
	p.cmd.Stderr = p.tail
	if c.Stderr != nil {
		p.cmd.Stderr = io.MultiWriter(c.Stderr, p.tail)
	}
	if p.stdin, err = p.cmd.StdinPipe(); err == nil {
		err = startTied(p.cmd)
	}
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	go func() {
		p.err = p.cmd.Wait()
		os.RemoveAll(dir)
		close(p.done)
	}()
	return p, nil
}

// take returns the spare, if it is still alive, or starts a child.
func (c *Child) take() (*childProcess, error) {
	c.mu.Lock()
	p := c.spare
	c.spare = nil
	c.mu.Unlock()
	if p != nil {
		select {
		case <-p.done: // it died waiting
		default:
			return p, nil
		}
	}
	return c.start()
}

// refill starts a spare unless there is one, one is starting, or the
// Child is closed.
func (c *Child) refill() {
	c.mu.Lock()
	if c.spare != nil || c.starting || c.closed {
		c.mu.Unlock()
		return
	}
	c.starting = true
	c.mu.Unlock()
	p, err := c.start()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.starting = false
	switch {
	case err != nil:
		// The next Verify starts its own child and reports why it cannot.
	case c.closed:
		p.stdin.Close() // a child that reads no subject exits
	default:
		c.spare = p
	}
}

// Close stops the spare and waits for it to exit; a Verify after Close
// starts a child of its own and keeps no spare.
func (c *Child) Close() {
	c.mu.Lock()
	c.closed = true
	p := c.spare
	c.spare = nil
	c.mu.Unlock()
	if p != nil {
		p.stdin.Close()
		<-p.done
	}
}

// Verify runs one child for subject, whose manifest is manifest (as
// Verifier.VerifyManifest takes it), and returns its verdict and what it
// spent. A child that fails is an error (the work is tried again later);
// the error names how it ended and the last lines it logged. The child
// is given the limit of ctx (WithMaxDeclared); one that exits ExitLarge
// is ErrLarge.
func (c *Child) Verify(ctx context.Context, subject name.Digest, manifest *registry.RawManifest) (*api.Verdict, Cost, error) {
	p, err := c.take()
	if err != nil {
		return nil, Cost{}, fmt.Errorf("starting the verification of %s: %w", subject, err)
	}
	go c.refill()
	pid := p.cmd.Process.Pid
	if c.CPULimit > 0 {
		if err := limitCPU(pid, c.CPULimit); err != nil {
			_ = p.cmd.Process.Kill()
			<-p.done
			return nil, Cost{}, fmt.Errorf("limiting the CPU time of the verification of %s: %w", subject, err)
		}
	}

	over := make(chan string, 2)
	stop := make(chan struct{})
	go c.watch(p.cmd.Process, over, stop)
	if c.Timeout > 0 {
		t := time.AfterFunc(c.Timeout, func() {
			over <- fmt.Sprintf("took more than %s", c.Timeout)
			_ = p.cmd.Process.Kill()
		})
		defer t.Stop()
	}
	grace := c.StopGrace
	if grace == 0 {
		grace = 10 * time.Second
	}
	stopOnCancel := context.AfterFunc(ctx, func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		time.AfterFunc(grace, func() { _ = p.cmd.Process.Kill() })
	})
	if err := writeTask(p.stdin, Task{Subject: subject, Manifest: manifest, MaxDeclared: maxDeclared(ctx)}); err != nil {
		_ = p.cmd.Process.Kill() // it cannot verify what it was not told
	}
	p.stdin.Close()
	<-p.done
	stopOnCancel()
	close(stop)
	cost := Cost{CPU: p.cmd.ProcessState.UserTime() + p.cmd.ProcessState.SystemTime()}
	if ru, ok := p.cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		cost.PeakMemory = ru.Maxrss << 10 // KiB on Linux
	}
	select {
	case why := <-over:
		return nil, cost, fmt.Errorf("the verification of %s %s and was stopped: %w", subject, why, ErrOverLimit)
	default:
	}
	if ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && c.CPULimit > 0 && ws.Signaled() && ws.Signal() == syscall.SIGKILL && cost.CPU >= c.CPULimit-time.Second {
		return nil, cost, fmt.Errorf("the verification of %s used %s of CPU time, its limit: %w", subject, cost.CPU.Round(time.Second), ErrCPULimit)
	}
	if p.err != nil {
		if ctx.Err() != nil {
			return nil, cost, context.Cause(ctx)
		}
		switch p.cmd.ProcessState.ExitCode() {
		case ExitLarge:
			return nil, cost, fmt.Errorf("the verification of %s stopped: %s: %w", subject, p.tail.lastLines(1), ErrLarge)
		case exitGoRuntime:
			return nil, cost, fmt.Errorf("the verification of %s crashed (%s): %w", subject, p.tail.crashLine(), ErrCrashed)
		}
		return nil, cost, fmt.Errorf("the verification of %s ended without a verdict (%v): %s", subject, p.err, p.tail.lastLines(3))
	}
	dec := json.NewDecoder(&p.stdout)
	var v api.Verdict
	if err := dec.Decode(&v); err != nil {
		return nil, cost, fmt.Errorf("reading the verdict of the verification of %s: %w", subject, err)
	}
	var spent Cost
	if err := dec.Decode(&spent); err == nil {
		cost.Decompressed, cost.Spooled = spent.Decompressed, spent.Spooled
	}
	if v.Subject != subject.DigestStr() || v.Repository != subject.RepositoryStr() {
		return nil, cost, fmt.Errorf("the verification of %s answered about %s@%s", subject, v.Repository, v.Subject)
	}
	return &v, cost, nil
}

// maxTaskLine bounds each line of a task: a reference, a media type.
const maxTaskLine = 4096

// Task is what a child is given to verify (Child.Verify writes it on its
// standard input, ReadTask reads it).
type Task struct {
	Subject name.Digest
	// Manifest is the subject's manifest as the parent fetched it; nil
	// when a person running verify-one by hand gave the subject alone:
	// the child fetches it.
	Manifest *registry.RawManifest
	// MaxDeclared, when not 0, is the most the image may declare before
	// the verification stops with ErrLarge (WithMaxDeclared): the parent
	// runs it in a reserve slot.
	MaxDeclared int64
}

// writeTask writes a child's task: the subject on one line, the media
// type of its manifest on the next, the limit on what the image may
// declare (0: none) on the third, then the manifest's bytes.
func writeTask(w io.Writer, t Task) error {
	if strings.ContainsAny(string(t.Manifest.MediaType), "\r\n") {
		return fmt.Errorf("the media type %q of %s spans lines", t.Manifest.MediaType, t.Subject)
	}
	if _, err := io.WriteString(w, t.Subject.String()+"\n"+string(t.Manifest.MediaType)+"\n"+strconv.FormatInt(t.MaxDeclared, 10)+"\n"); err != nil {
		return err
	}
	_, err := w.Write(t.Manifest.Bytes)
	return err
}

// ReadTask reads the task Child.Verify writes on a child's standard
// input: the subject, parsed with opts, its manifest as the parent
// fetched it, at most registry.MaxIndexSize bytes, and the limit on what
// the image may declare. The manifest's Digest is that of the bytes read;
// Verifier.VerifyManifest compares it with the subject's. A task of the
// subject alone, as a person running verify-one by hand gives it, has no
// manifest: the child fetches it. ok is false when the input ended before
// a subject: the child was a spare that is no longer needed.
func ReadTask(r io.Reader, opts ...name.Option) (task Task, ok bool, err error) {
	br := bufio.NewReader(io.LimitReader(r, 3*maxTaskLine+registry.MaxIndexSize+1))
	line := func(what string) (string, error) {
		l, err := br.ReadString('\n')
		switch {
		case err != nil:
			return l, fmt.Errorf("reading the %s of the task: %w", what, err)
		case len(l) > maxTaskLine:
			return l, fmt.Errorf("the %s of the task is over %d bytes", what, maxTaskLine)
		}
		return strings.TrimSuffix(l, "\n"), nil
	}
	ref, err := line("subject")
	if ref == "" && errors.Is(err, io.EOF) {
		return Task{}, false, nil
	}
	if err != nil {
		return Task{}, false, err
	}
	if task.Subject, err = name.NewDigest(ref, opts...); err != nil {
		return Task{}, false, err
	}
	mt, err := line("media type")
	if mt == "" && errors.Is(err, io.EOF) {
		return task, true, nil
	}
	if err != nil {
		return Task{}, false, err
	}
	limit, err := line("limit")
	if err != nil {
		return Task{}, false, err
	}
	if task.MaxDeclared, err = strconv.ParseInt(limit, 10, 64); err != nil || task.MaxDeclared < 0 {
		return Task{}, false, fmt.Errorf("the limit of the task %q is not a size", limit)
	}
	b, err := io.ReadAll(br)
	if err != nil {
		return Task{}, false, fmt.Errorf("reading the manifest of the task: %w", err)
	}
	if len(b) > registry.MaxIndexSize {
		return Task{}, false, fmt.Errorf("the manifest of the task is over %d bytes", registry.MaxIndexSize)
	}
	task.Manifest = &registry.RawManifest{Digest: digest.FromBytes(b).String(), MediaType: types.MediaType(mt), Bytes: b}
	return task, true, nil
}

// watch kills p once its resident memory passes MemoryLimit, saying why
// on over, and lowers its priority as its CPU time grows (niceAfter),
// until stop is closed.
func (c *Child) watch(p *os.Process, over chan<- string, stop <-chan struct{}) {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	nice := 0
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		if cpu, err := cpuTime(p.Pid); err == nil && niceAfter(cpu) != nice {
			nice = niceAfter(cpu)
			_ = renice(p.Pid, nice)
		}
		if c.MemoryLimit <= 0 {
			continue
		}
		if rss, err := residentBytes(p.Pid); err == nil && rss > c.MemoryLimit {
			over <- fmt.Sprintf("used %d MiB, over its limit of %d MiB,", rss>>20, c.MemoryLimit>>20)
			_ = p.Kill()
			return
		}
	}
}

// residentBytes is process pid's resident set size, from /proc.
func residentBytes(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kib, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kib << 10, err
		}
	}
	return 0, errors.New("no VmRSS line")
}

// LimitSelf prepares a child for its verification: the Go collector works
// to keep the heap under three quarters of limit, and the process offers
// itself as the kernel's first victim when memory runs out, so that the
// parent and the other verifications survive.
func LimitSelf(limit int64) {
	if limit > 0 {
		debug.SetMemoryLimit(limit / 4 * 3)
	}
	_ = os.WriteFile("/proc/self/oom_score_adj", []byte("1000"), 0)
}

// limitedWriter passes at most n bytes to w and fails after.
type limitedWriter struct {
	w io.Writer
	n int64
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	if int64(len(p)) > l.n {
		return 0, errors.New("the verification printed more than a verdict")
	}
	l.n -= int64(len(p))
	return l.w.Write(p)
}

// tailBuffer keeps the last max bytes written to it, and the first line
// of a Go runtime error, which its goroutines' traces would push out.
type tailBuffer struct {
	mu    sync.Mutex
	max   int
	b     []byte
	crash string
}

// runtimeError starts the line a Go program prints when a runtime error
// ends it.
var runtimeError = regexp.MustCompile(`(?m)^(fatal error|panic): [^\n]*\n`)

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if t.crash == "" {
		if m := runtimeError.Find(t.b); m != nil {
			t.crash = strings.TrimSpace(string(m[:min(len(m), 300)]))
		}
	}
	if over := len(t.b) - t.max; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(p), nil
}

// crashLine is the runtime error's line, else the last line written.
func (t *tailBuffer) crashLine() string {
	t.mu.Lock()
	crash := t.crash
	t.mu.Unlock()
	if crash == "" {
		return t.lastLines(1)
	}
	return crash
}

// lastLines is the last n non-empty lines written, joined with " | ".
func (t *tailBuffer) lastLines(n int) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var lines []string
	for _, l := range strings.Split(string(t.b), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	if len(lines) == 0 {
		return "it logged nothing"
	}
	return strings.Join(lines, " | ")
}

// MaxOverLimit is how many verifications of one digest in a row may go
// past the memory limit before the digest is refused (verification-limit)
// instead of tried again.
const MaxOverLimit = 3

// limitCounts counts, per digest, the verifications in a row that went
// past the memory limit.
type limitCounts struct {
	mu sync.Mutex
	n  map[string]int
}

// count records one more and returns how many in a row.
func (l *limitCounts) count(d name.Digest) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n == nil {
		l.n = map[string]int{}
	}
	l.n[d.String()]++
	return l.n[d.String()]
}

func (l *limitCounts) forget(d name.Digest) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.n, d.String())
}
