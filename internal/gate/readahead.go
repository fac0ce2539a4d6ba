package gate

import (
	"io"
	"sync"
)

// readAhead reads r on a goroutine of its own, a few buffers ahead of its
// reader: the blob's digest, which the registry client computes as the
// blob is read, then runs beside the decompression instead of before each
// of its reads. Close stops the goroutine; it does not close r.
type readAhead struct {
	full, free chan []byte
	stop       chan struct{}
	done       sync.WaitGroup
	buf        []byte // the buffer being read from, whole
	cur        []byte // what is left of it
	err        error  // r's, once full is drained
}

const (
	readAheadBuffers = 4
	readAheadSize    = 256 << 10
)

func newReadAhead(r io.Reader) *readAhead {
	a := &readAhead{full: make(chan []byte, readAheadBuffers), free: make(chan []byte, readAheadBuffers), stop: make(chan struct{})}
	for range readAheadBuffers {
		a.free <- make([]byte, readAheadSize)
	}
	a.done.Go(func() {
		defer close(a.full)
		for {
			var buf []byte
			select {
			case buf = <-a.free:
			case <-a.stop:
				return
			}
			n, err := io.ReadFull(r, buf)
			if n > 0 {
				a.full <- buf[:n]
			}
			if err == io.ErrUnexpectedEOF {
				err = io.EOF
			}
			if err != nil {
				a.err = err
				return
			}
		}
	})
	return a
}

func (a *readAhead) Read(p []byte) (int, error) {
	for len(a.cur) == 0 {
		if a.buf != nil {
			a.free <- a.buf[:cap(a.buf)]
			a.buf = nil
		}
		buf, ok := <-a.full
		if !ok {
			return 0, a.err // set before full was closed
		}
		a.buf, a.cur = buf, buf
	}
	n := copy(p, a.cur)
	a.cur = a.cur[n:]
	return n, nil
}

// Close stops the reading goroutine and waits for it.
func (a *readAhead) Close() error {
	close(a.stop)
	for range a.full { // unblock a send in progress
	}
	a.done.Wait()
	return nil
}
