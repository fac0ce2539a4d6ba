package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/imagepipe/imagepipe/test/harness"
)

// keptRuns is how many runs' log directories the demo keeps; older ones are removed.
const keptRuns = 10

// interrupted is the cause of the demo's context when a signal ends it.
type interrupted struct{ sig os.Signal }

func (e interrupted) Error() string { return "interrupted by " + e.sig.String() }

func main() {
	var cfg config
	// A flag set of its own: libraries linked in register flags on the global one.
	flags := flag.NewFlagSet("demo", flag.ExitOnError)
	short := flags.Bool("short", false, "the short mode CI runs: a 32 MiB sample disk")
	flags.StringVar(&cfg.imagectl, "imagectl", "", "imagectl binary (default: bin/imagectl of the repository)")
	flags.StringVar(&cfg.syncer, "image-syncer", "", "image-syncer binary (default: bin/image-syncer of the repository)")
	flags.StringVar(&cfg.gate, "image-gate", "", "image-gate binary (default: bin/image-gate of the repository)")
	flags.StringVar(&cfg.logDir, "logs", "", "directory to keep the components' logs in (default: DEMO/logs/TIME, where DEMO is $IMAGEPIPE_CACHE/demo or ~/.cache/imagepipe/demo; the newest 10 runs are kept)")
	flags.Usage = func() {
		fmt.Fprintf(flags.Output(), "Usage: %s [flags]\n\nRuns imagepipe's whole pipeline on 127.0.0.1 and explains each step (make demo).\n\n", os.Args[0])
		flags.PrintDefaults()
	}
	_ = flags.Parse(os.Args[1:]) // ExitOnError: exits on an error
	cfg.full = !*short
	if cfg.logDir == "" {
		cfg.logDir = newLogDir()
	}
	os.Exit(run(cfg))
}

// run runs the demo and returns the exit status: 0, 1 when it failed or could not run, or
// 128+N when signal N interrupted it. SIGINT and SIGTERM cancel the demo's context: the step
// under way stops, the cleanups stop every server newest first (SIGTERM, then SIGKILL after
// 5 s), and the logs are kept. The servers run in process groups of their own, so that a Ctrl-C
// on the terminal reaches only the demo, and with a parent-death signal, so that even a SIGKILL
// of the demo takes them along.
func run(cfg config) int {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		sig, ok := <-sigs
		if !ok {
			return
		}
		// From now on the default action applies: a second Ctrl-C ends the demo at once, and
		// the kernel then kills every server it started (they run with a parent-death signal).
		signal.Stop(sigs)
		fmt.Fprintf(os.Stderr, "\n%s: stopping everything the demo started (Ctrl-C again to kill it all at once)...\n", sig)
		cancel(interrupted{sig})
	}()

	errLog := &lazyFile{path: filepath.Join(cfg.logDir, "demo-errors.log")}
	defer errLog.Close()
	r := newRunner(ctx, errLog)
	failed, skipped := r.run(func(t harness.T) { runDemo(t, cfg) })
	signal.Stop(sigs)
	close(sigs)

	var intr interrupted
	switch {
	case errors.As(context.Cause(ctx), &intr):
		fmt.Fprintf(os.Stderr, "demo: %v; everything it started has been stopped.\n", intr)
		if s, ok := intr.sig.(syscall.Signal); ok {
			return 128 + int(s)
		}
		return 130
	case skipped:
		fmt.Fprintln(os.Stderr, "demo: could not run; see above.")
		return 1
	case failed:
		fmt.Fprintf(os.Stderr, "demo: FAILED; the components' logs are in %s\n", cfg.logDir)
		return 1
	}
	return 0
}

// newLogDir returns a new directory name for this run's logs, DEMO/logs/TIME, and removes all
// but the newest keptRuns-1 older runs.
func newLogDir() string {
	cache := os.Getenv("IMAGEPIPE_CACHE")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			home = os.TempDir()
		}
		cache = filepath.Join(home, ".cache", "imagepipe")
	}
	logs := filepath.Join(cache, "demo", "logs")
	if entries, err := os.ReadDir(logs); err == nil {
		var runs []string
		for _, e := range entries {
			if e.IsDir() {
				runs = append(runs, e.Name())
			}
		}
		slices.Sort(runs) // names are times, so oldest first
		for len(runs) > keptRuns-1 {
			_ = os.RemoveAll(filepath.Join(logs, runs[0]))
			runs = runs[1:]
		}
	}
	return filepath.Join(logs, time.Now().Format("20060102-150405"))
}

// lazyFile is a file created, with its directory, on the first write, so that a run without
// errors leaves none.
type lazyFile struct {
	path string
	mu   sync.Mutex
	f    *os.File
}

func (l *lazyFile) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		if err := os.MkdirAll(filepath.Dir(l.path), 0o755); err != nil {
			return 0, err
		}
		f, err := os.OpenFile(l.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return 0, err
		}
		l.f = f
	}
	return l.f.Write(p)
}

func (l *lazyFile) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	return l.f.Close()
}
