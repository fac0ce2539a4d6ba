package source

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"
)

// maxResumes is how many times one download is resumed after a failure.
const maxResumes = 3

// resumeBackoff is the wait before the first resume; it doubles for each
// further one. Tests shorten it.
var resumeBackoff = time.Second

// reopenFunc reopens a remote object at byte off. A failure with permanent
// set is not retried: the object changed, or the server refuses ranges.
type reopenFunc func(ctx context.Context, off int64) (body io.ReadCloser, permanent bool, err error)

// resumingReader reads a remote object front to back. When the body fails
// before its end and reopen is set, it waits and continues from the first
// byte not yet delivered, so its reader sees one unbroken stream.
type resumingReader struct {
	ctx    context.Context // the Open call's context, for backoff waits
	body   io.ReadCloser
	off    int64 // bytes delivered so far
	size   int64 // announced size, -1 if unknown
	reopen reopenFunc
	log    *slog.Logger

	resumes int
	pending error // a failure to recover from on the next Read
}

func (r *resumingReader) Read(p []byte) (int, error) {
	for {
		if r.pending != nil {
			if err := r.resume(); err != nil {
				return 0, err
			}
		}
		n, err := r.body.Read(p)
		r.off += int64(n)
		if err == nil {
			return n, nil
		}
		if errors.Is(err, io.EOF) {
			if r.size < 0 || r.off >= r.size {
				return n, io.EOF
			}
			err = fmt.Errorf("the connection closed at byte %d of %d: %w", r.off, r.size, io.ErrUnexpectedEOF)
		}
		if r.reopen == nil || r.ctx.Err() != nil {
			return n, err
		}
		r.pending = err
		if n > 0 {
			return n, nil
		}
	}
}

// resume replaces the failed body with one starting at r.off.
func (r *resumingReader) resume() error {
	cause := r.pending
	r.pending = nil
	r.body.Close()
	r.body = eofBody{}
	for {
		if r.resumes >= maxResumes {
			return fmt.Errorf("giving up after %d resumes: %w", r.resumes, cause)
		}
		delay := resumeBackoff << r.resumes
		r.resumes++
		r.log.Info("resuming the download", "offset", r.off, "attempt", r.resumes, "delay", delay, "error", cause)
		t := time.NewTimer(delay)
		select {
		case <-r.ctx.Done():
			t.Stop()
			return r.ctx.Err()
		case <-t.C:
		}
		body, permanent, err := r.reopen(r.ctx, r.off)
		if err == nil {
			r.body = body
			return nil
		}
		if permanent {
			return fmt.Errorf("resuming at byte %d: %w (after: %w)", r.off, err, cause)
		}
		cause = err
	}
}

func (r *resumingReader) Close() error { return r.body.Close() }

// eofBody stands in for a closed body between attempts.
type eofBody struct{}

func (eofBody) Read([]byte) (int, error) { return 0, io.EOF }
func (eofBody) Close() error             { return nil }
