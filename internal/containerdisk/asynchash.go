package containerdisk

import (
	"hash"
	"sync"
)

// asyncHash feeds a hash on a goroutine of its own, so that hashing a
// layer's tar runs beside its decompression instead of after each read.
// Write copies into one of a few buffers and returns; it blocks only
// while all of them wait to be hashed, which bounds the memory to
// asyncBuffers × asyncBufferSize.
type asyncHash struct {
	h     hash.Hash
	once  sync.Once
	queue chan []byte
	free  chan []byte
	done  chan struct{}
	stop  sync.Once
}

const (
	asyncBuffers    = 4
	asyncBufferSize = 256 << 10
)

func newAsyncHash(h hash.Hash) *asyncHash {
	return &asyncHash{h: h, queue: make(chan []byte, asyncBuffers), free: make(chan []byte, asyncBuffers), done: make(chan struct{})}
}

func (a *asyncHash) start() {
	for range asyncBuffers {
		a.free <- make([]byte, asyncBufferSize)
	}
	go func() {
		defer close(a.done)
		for b := range a.queue {
			a.h.Write(b)
			a.free <- b[:cap(b)]
		}
	}()
}

// Write queues a copy of p for hashing.
func (a *asyncHash) Write(p []byte) (int, error) {
	a.once.Do(a.start)
	n := len(p)
	for len(p) > 0 {
		buf := <-a.free
		k := copy(buf, p)
		a.queue <- buf[:k]
		p = p[k:]
	}
	return n, nil
}

// Sum waits until everything written is hashed and returns the sum.
// Nothing may be written after it.
func (a *asyncHash) Sum() []byte {
	a.close()
	return a.h.Sum(nil)
}

// close stops the goroutine once what was written is hashed.
func (a *asyncHash) close() {
	a.stop.Do(func() {
		a.once.Do(func() { close(a.done) }) // never started: nothing to wait for
		close(a.queue)
		<-a.done
	})
}
