package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/term"
)

// progressInterval is the least time between two draws of a bar.
const progressInterval = 100 * time.Millisecond

// progressBar draws "label [=====>    ] 45% 1.2 GiB/2.6 GiB 350 MiB/s ETA 4s"
// on a terminal, at most ten times a second, and its last figures when it
// finishes. On anything else it is silent.
type progressBar struct {
	w       io.Writer
	label   string
	enabled bool

	mu    sync.Mutex
	start time.Time
	last  time.Time
	drawn bool
	// done and total are the last figures reported; stale says they
	// were not drawn (throttled), so that finish draws them.
	done, total int64
	stale       bool
}

// newProgressBar draws to stderr when it is a terminal and quiet is false.
func newProgressBar(label string, quiet bool) *progressBar {
	return &progressBar{
		w:       os.Stderr,
		label:   label,
		enabled: !quiet && term.IsTerminal(int(os.Stderr.Fd())),
	}
}

// update reports done of total bytes (total < 0: unknown).
func (p *progressBar) update(done, total int64) {
	if !p.enabled {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	if p.start.IsZero() {
		p.start = now
	}
	p.done, p.total = done, total
	if now.Sub(p.last) < progressInterval {
		p.stale = true // finish draws it, if nothing later does
		return
	}
	p.draw(now)
}

// draw writes the bar with the last figures; p.mu is held.
func (p *progressBar) draw(now time.Time) {
	p.last = now
	p.drawn = true
	p.stale = false
	fmt.Fprint(p.w, "\r"+renderProgress(p.label, p.done, p.total, now.Sub(p.start))+"\033[K")
}

// finish draws the last figures, if they were not drawn, and ends the
// line the bar was drawn on.
func (p *progressBar) finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stale {
		p.draw(time.Now())
	}
	if p.drawn {
		fmt.Fprintln(p.w)
		p.drawn = false
	}
}

// renderProgress formats one progress line.
func renderProgress(label string, done, total int64, elapsed time.Duration) string {
	rate := 0.0
	if s := elapsed.Seconds(); s > 0 {
		rate = float64(done) / s
	}
	if total <= 0 {
		return fmt.Sprintf("%s %s %s/s", label, shortBytes(done), shortBytes(int64(rate)))
	}
	const width = 30
	frac := min(float64(done)/float64(total), 1)
	filled := int(frac * width)
	bar := strings.Repeat("=", filled)
	if filled < width {
		bar += ">" + strings.Repeat(" ", width-filled-1)
	}
	eta := "--"
	if rate > 0 {
		eta = time.Duration(float64(total-done) / rate * float64(time.Second)).Round(time.Second).String()
	}
	return fmt.Sprintf("%s [%s] %3.0f%% %s/%s %s/s ETA %s", label, bar, frac*100, shortBytes(done), shortBytes(total), shortBytes(int64(rate)), eta)
}
