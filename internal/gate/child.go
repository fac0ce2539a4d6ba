package gate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/imagepipe/imagepipe/pkg/api"
)

// Child runs each verification in a process of its own, so that one that
// crashes or runs out of memory stops no other: the process is Path with
// Args, then --verify-temp-dir DIR and the subject; it writes the verdict
// as JSON on its standard output and exits 0, or exits non-zero without a
// verdict. Each child gets a folder of its own under TempDir, removed when
// it exits however it ends, so a killed child leaves no spool behind.
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
	// TempDir holds the children's folders ("" means $TMPDIR).
	TempDir string
	// Stderr receives the children's logs; nil discards them.
	Stderr io.Writer
	// StopGrace is how long a child may take to stop after SIGTERM when
	// the context ends, before it is killed; 0 means 10 s.
	StopGrace time.Duration
}

// ErrOverLimit is matched by Verify's error when the child was stopped
// for passing MemoryLimit.
var ErrOverLimit = errors.New("over the verification's memory limit")

// maxChildVerdict bounds what a child may print: one verdict.
const maxChildVerdict = 1 << 20

// Verify runs one child for subject and returns its verdict. A child that
// fails is an error (the work is tried again later); the error names how
// it ended and the last lines it logged.
func (c *Child) Verify(ctx context.Context, subject name.Digest) (*api.Verdict, error) {
	dir, err := os.MkdirTemp(c.TempDir, "verify-")
	if err != nil {
		return nil, fmt.Errorf("creating the verification folder: %w", err)
	}
	defer os.RemoveAll(dir)
	args := append(append([]string(nil), c.Args...), "--verify-temp-dir", dir, subject.String())
	cmd := exec.CommandContext(ctx, c.Path, args...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = c.StopGrace
	if cmd.WaitDelay == 0 {
		cmd.WaitDelay = 10 * time.Second
	}
	var stdout bytes.Buffer
	tail := &tailBuffer{max: 4096}
	cmd.Stdout = &limitedWriter{w: &stdout, n: maxChildVerdict}
	cmd.Stderr = tail
	if c.Stderr != nil {
		cmd.Stderr = io.MultiWriter(c.Stderr, tail)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the verification of %s: %w", subject, err)
	}
	over := make(chan int64, 1)
	stop := make(chan struct{})
	go c.watch(cmd.Process, over, stop)
	err = cmd.Wait()
	close(stop)
	select {
	case rss := <-over:
		return nil, fmt.Errorf("the verification of %s used %d MiB, over its limit of %d MiB, and was stopped: %w", subject, rss>>20, c.MemoryLimit>>20, ErrOverLimit)
	default:
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		return nil, fmt.Errorf("the verification of %s ended without a verdict (%v): %s", subject, err, tail.lastLines(3))
	}
	var v api.Verdict
	if err := json.Unmarshal(stdout.Bytes(), &v); err != nil {
		return nil, fmt.Errorf("reading the verdict of the verification of %s: %w", subject, err)
	}
	if v.Subject != subject.DigestStr() || v.Repository != subject.RepositoryStr() {
		return nil, fmt.Errorf("the verification of %s answered about %s@%s", subject, v.Repository, v.Subject)
	}
	return &v, nil
}

// watch kills p once its resident memory passes MemoryLimit, sending
// the size seen on over, until stop is closed.
func (c *Child) watch(p *os.Process, over chan<- int64, stop <-chan struct{}) {
	if c.MemoryLimit <= 0 {
		return
	}
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		if rss, err := residentBytes(p.Pid); err == nil && rss > c.MemoryLimit {
			over <- rss
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

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if over := len(t.b) - t.max; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(p), nil
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
