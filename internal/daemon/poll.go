package daemon

import (
	"context"
	"log/slog"
	"time"

	"github.com/imagepipe/imagepipe/internal/intake"
)

// MaxSkippedPasses bounds the fast passes a PollLoop skips in a row while
// work is waiting.
const MaxSkippedPasses = 10

// PollLoop polls the registry until its context ends. Every Interval it
// runs a fast pass, and a full one (every tag's digest looked up again)
// once Resync has passed since the last full pass that succeeded; the
// first pass is a full one. A failed pass is logged and handed on like
// any other.
//
// A fast pass waits while Waiting reports work: it would list again what
// the daemon is still working through (a first sync of thousands of
// tags), and webhooks go on arriving meanwhile. At most MaxSkippedPasses
// wait in a row, so that one tenant who pushes without pause cannot hold
// back the others' missed webhooks. Full passes never wait.
type PollLoop struct {
	Poller *intake.Poller
	// Interval is the time between two passes; Resync between two full ones.
	Interval, Resync time.Duration
	// Waiting is the work the daemon has not done yet; nil: none.
	Waiting func() int
	// Polled is handed each pass: whether it was full, the events it
	// found and its error.
	Polled func(full bool, events []intake.Event, err error)
	// Skipped, when set, is told of each fast pass that waited.
	Skipped func()
	// Logger gets failed passes, and each pass at debug level; nil discards.
	Logger *slog.Logger
}

// Run polls until ctx ends, then returns nil.
func (l *PollLoop) Run(ctx context.Context) error {
	log := orDiscard(l.Logger)
	var lastFull time.Time
	var skipped int
	t := time.NewTicker(l.Interval)
	defer t.Stop()
	for {
		full := lastFull.IsZero() || time.Since(lastFull) >= l.Resync
		if !full && l.waiting() > 0 && skipped < MaxSkippedPasses {
			skipped++
			if l.Skipped != nil {
				l.Skipped()
			}
		} else {
			skipped = 0
			start := time.Now()
			poll := l.Poller.Poll
			if full {
				poll = l.Poller.PollDigests
			}
			events, err := poll(ctx)
			if full && err == nil {
				lastFull = start
			}
			if err != nil && ctx.Err() == nil {
				log.Warn("polling the registry failed; nothing is changed until it answers", "error", err)
			}
			if l.Polled != nil {
				l.Polled(full, events, err)
			}
			log.Debug("poll done", "full", full, "events", len(events), "seconds", time.Since(start).Seconds())
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (l *PollLoop) waiting() int {
	if l.Waiting == nil {
		return 0
	}
	return l.Waiting()
}
