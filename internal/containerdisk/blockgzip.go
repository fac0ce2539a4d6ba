package containerdisk

import (
	"encoding/binary"
	"hash/crc32"
	"io"
	"runtime"
	"sync"
)

// gzipBlockSize is the input of one independently compressed block.
const gzipBlockSize = 1 << 20

// deflateBlock compresses src as part of one raw deflate stream into dst
// (cap at least deflateBound(len(src))) and returns the compressed bytes.
// A non-final block ends byte-aligned after a full flush, so blocks
// compressed separately concatenate into one valid stream; the final block
// sets BFINAL.
type deflateBlock func(dst, src []byte, final bool, scratch *blockScratch) ([]byte, error)

// blockScratch is a compressor's per-goroutine working memory.
type blockScratch struct{ b []byte }

// deflateBound is an upper bound of a block's compressed size.
func deflateBound(n int) int { return n + n/16 + 4096 }

// blockGzip is a parallel gzip writer. Input is cut into fixed 1 MiB
// blocks, each deflated on its own by one of GOMAXPROCS workers, and the
// results are written in order behind one gzip header and trailer. Output
// depends only on the input, never on concurrency or write sizes, which
// keeps layers reproducible.
type blockGzip struct {
	w        io.Writer
	compress deflateBlock
	buf      []byte
	crc      uint32
	size     uint32

	jobs    chan *gzipJob // in input order
	results chan *gzipJob // same order, for the writer
	sem     chan struct{} // bounds blocks in flight
	failed  chan struct{} // closed when the writer fails
	spare   sync.Pool     // *[]byte buffers: block inputs and outputs
	werr    error         // the writer's error, once failed is closed
	done    chan error
	once    sync.Once
	err     error
}

type gzipJob struct {
	src   []byte
	final bool
	out   []byte
	err   error
	ready chan struct{}
}

func newBlockGzip(w io.Writer, compress deflateBlock) *blockGzip {
	n := runtime.GOMAXPROCS(0)
	g := &blockGzip{
		w: w, compress: compress,
		buf:     make([]byte, 0, deflateBound(gzipBlockSize)),
		jobs:    make(chan *gzipJob, 2*n),
		results: make(chan *gzipJob, 2*n),
		sem:     make(chan struct{}, 2*n),
		failed:  make(chan struct{}),
		done:    make(chan error, 1),
	}
	for range n {
		go g.worker()
	}
	go g.writer()
	return g
}

func (g *blockGzip) worker() {
	var sc blockScratch
	for j := range g.jobs {
		j.out, j.err = g.compress(g.buffer(deflateBound(gzipBlockSize)), j.src, j.final, &sc)
		close(j.ready)
	}
}

// buffer returns an empty buffer of capacity n from the spares.
func (g *blockGzip) buffer(n int) []byte {
	if b, ok := g.spare.Get().(*[]byte); ok && cap(*b) >= n {
		return (*b)[:0]
	}
	return make([]byte, 0, n)
}

func (g *blockGzip) recycle(b []byte) {
	if cap(b) >= gzipBlockSize {
		g.spare.Put(&b)
	}
}

// writer emits the header, the blocks in order, and the trailer.
func (g *blockGzip) writer() {
	var err error
	if _, err = g.w.Write(blockGzipHeader[:]); err != nil {
		g.finishWriter(err)
		return
	}
	for j := range g.results {
		<-j.ready
		if err == nil {
			err = j.err
		}
		if err == nil {
			_, err = g.w.Write(j.out)
		}
		g.recycle(j.src)
		g.recycle(j.out)
		<-g.sem
		if j.final && err == nil {
			var trailer [8]byte
			binary.LittleEndian.PutUint32(trailer[0:], g.crc)
			binary.LittleEndian.PutUint32(trailer[4:], g.size)
			_, err = g.w.Write(trailer[:])
		}
	}
	g.finishWriter(err)
}

func (g *blockGzip) finishWriter(err error) {
	if err != nil {
		g.werr = err
		close(g.failed)
	}
	for j := range g.results { // drain, so that Close returns
		<-j.ready
		<-g.sem
	}
	g.done <- err
}

// submit hands the buffered block to the workers.
func (g *blockGzip) submit(final bool) error {
	g.crc = crc32.Update(g.crc, crc32.IEEETable, g.buf)
	g.size += uint32(len(g.buf))
	j := &gzipJob{src: g.buf, final: final, ready: make(chan struct{})}
	select {
	case g.sem <- struct{}{}:
	case <-g.failed:
		return g.werr
	}
	g.results <- j
	g.jobs <- j
	g.buf = g.buffer(gzipBlockSize)
	return nil
}

func (g *blockGzip) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		if len(g.buf) == gzipBlockSize {
			if err := g.submit(false); err != nil {
				return n - len(p), err
			}
		}
		k := copy(g.buf[len(g.buf):gzipBlockSize], p)
		g.buf = g.buf[:len(g.buf)+k]
		p = p[k:]
	}
	return n, nil
}

// Close compresses the last block and waits for everything to be written.
func (g *blockGzip) Close() error {
	g.once.Do(func() {
		serr := g.submit(true)
		close(g.jobs)
		close(g.results)
		g.err = <-g.done
		if g.err == nil {
			g.err = serr
		}
	})
	return g.err
}
