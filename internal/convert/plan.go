package convert

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/bits"
	"runtime"
	"sync"
	"sync/atomic"

	"golang.org/x/sync/errgroup"
)

// DefaultClusterSize is the qcow2 output cluster size: 64 KiB, as qemu-img.
const DefaultClusterSize = 64 << 10

// batchSize is the guest bytes one worker reads at a time.
const batchSize = 2 << 20

// compressedScanRatio: during the zero scan, compressed clusters whose
// stored data is at most cluster/compressedScanRatio bytes are decompressed
// to see whether they hold only zeros; larger ones are counted as data
// without decompressing. A cluster of zeros compresses to a few dozen bytes
// in zlib and zstd, so this finds every zero cluster a real encoder writes
// while keeping compressed inputs to one decompression pass.
const compressedScanRatio = 64

// Options says what to convert an image into. The zero value writes qcow2
// with 64 KiB clusters.
type Options struct {
	// To is FormatQCOW2 (default) or FormatRaw.
	To Format
	// ClusterSize is the qcow2 output cluster size, a power of two from
	// 512 B to 2 MiB; 0 means DefaultClusterSize.
	ClusterSize int64
	// Concurrency is the number of parallel readers; 0 means
	// max(4, GOMAXPROCS), enough to keep a disk busy.
	Concurrency int
	// Logger receives debug records; nil discards them.
	Logger *slog.Logger
	// Progress, when set, is told how far Write and WriteFile have got
	// through the guest disk: the bytes done, holes included, and the
	// virtual size. It is called from one goroutine at a time, with done
	// growing, and with done equal to the total at the end; Plan's scan
	// does not report. nil reports nothing.
	Progress func(done, total int64)
}

// progressCounter adds up the guest bytes done for Options.Progress. A nil
// counter reports nothing.
type progressCounter struct {
	fn    func(done, total int64)
	total int64

	mu   sync.Mutex
	done int64
}

func newProgressCounter(fn func(done, total int64), total int64) *progressCounter {
	if fn == nil {
		return nil
	}
	return &progressCounter{fn: fn, total: total}
}

// add counts n more bytes done.
func (c *progressCounter) add(n int64) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.done += n
	c.fn(c.done, c.total)
}

// Plan is a conversion whose output size is known. It is produced by
// Image.Plan and consumed by Write.
type Plan struct {
	img  *Image
	opts Options
	size int64

	// qcow2 output only.
	layout  *qcowLayout
	nonzero bitmap // bit per output cluster: holds non-zero data
	// singlePass: the bitmap is filled while reading (WriteFile), not by
	// an earlier scan; nothing can be skipped up front.
	singlePass bool
}

func (o Options) withDefaults() (Options, error) {
	if o.To == "" {
		o.To = FormatQCOW2
	}
	if o.To != FormatQCOW2 && o.To != FormatRaw {
		return o, fmt.Errorf("unsupported output format %q (qcow2 or raw)", o.To)
	}
	if o.ClusterSize == 0 {
		o.ClusterSize = DefaultClusterSize
	}
	if o.ClusterSize < 1<<minClusterBits || o.ClusterSize > 1<<maxClusterBits || o.ClusterSize&(o.ClusterSize-1) != 0 {
		return o, fmt.Errorf("cluster size %d is not a power of two between 512 and 2 MiB", o.ClusterSize)
	}
	if o.Concurrency <= 0 {
		o.Concurrency = max(4, runtime.GOMAXPROCS(0))
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o, nil
}

// Plan decides the exact output of converting img, which it verifies
// first (Verify). For raw output that is then immediate, once the guest
// content is known not to look like another format (a reject.AmbiguousRaw
// rejection otherwise, rawout.go); for qcow2 output it scans the image once
// to find the clusters that hold non-zero data (docs/import.md, "How the
// disk is converted"). The plan stays valid as long as the image does not
// change.
func (img *Image) Plan(ctx context.Context, opts Options) (*Plan, error) {
	if _, err := img.Verify(ctx); err != nil {
		return nil, err
	}
	return img.plan(ctx, opts)
}

// plan is Plan once the tables passed the walk: WriteFile's raw output
// decompresses while it writes and falls back to Verify's verdict.
func (img *Image) plan(ctx context.Context, opts Options) (*Plan, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if _, err := img.walk(ctx); err != nil {
		return nil, err
	}
	p := &Plan{img: img, opts: opts}
	if opts.To == FormatRaw {
		if err := img.checkRawOutput(ctx); err != nil {
			return nil, err
		}
		p.size = img.info.VirtualSize
		return p, nil
	}
	vsize := img.qcow2VirtualSize()
	p.nonzero = newBitmap(ceilDiv(vsize, opts.ClusterSize))
	if err := p.scan(ctx); err != nil {
		return nil, err
	}
	p.layout = newQCOWLayout(vsize, opts.ClusterSize, p.nonzero, false)
	p.size = p.layout.fileSize()
	opts.Logger.Debug("planned qcow2 output", "virtualSize", vsize, "dataClusters", p.layout.data, "bytes", p.size)
	return p, nil
}

// qcow2VirtualSize is the virtual size of qcow2 output: whole sectors, so a
// raw input of an odd size gets a zero-filled tail, as with qemu-img.
func (img *Image) qcow2VirtualSize() int64 { return (img.info.VirtualSize + 511) &^ 511 }

// Size is the exact number of bytes Write produces.
func (p *Plan) Size() int64 { return p.size }

// DataBytes is the guest bytes the planned qcow2 output stores as data:
// its non-zero clusters, the last one clipped to the virtual size. It
// depends on the image's content only, not on how a filesystem allocated
// the source. ok is false for raw output, which has no such scan.
func (p *Plan) DataBytes() (n int64, ok bool) {
	if p.layout == nil {
		return 0, false
	}
	cs := p.opts.ClusterSize
	n = p.layout.data * cs
	if last := (p.layout.vsize - 1) / cs; p.layout.vsize > 0 && p.nonzero.has(last) {
		n -= (last+1)*cs - p.layout.vsize
	}
	return n, true
}

// batchFor returns the guest bytes per work item: a multiple of both the
// input's alignment and the output cluster size.
func (p *Plan) batchFor() int64 {
	// Small images get small batches; powers of two keep the alignment.
	small := int64(1) << bits.Len64(uint64(p.img.info.VirtualSize-1))
	return max(min(batchSize, small), p.img.src.alignment(), p.opts.ClusterSize)
}

// scan marks each output cluster holding non-zero guest data.
func (p *Plan) scan(ctx context.Context) error {
	src, cs := p.img.src, p.opts.ClusterSize
	batch := p.batchFor()
	g, ctx := errgroup.WithContext(ctx)
	var next atomic.Int64 // hands out batches in order to the workers
	for range min(int64(p.opts.Concurrency), ceilDiv(p.img.info.VirtualSize, batch)) {
		g.Go(func() error {
			sc := getScratch()
			defer sc.close()
			var buf []byte // allocated once there is data to look at
			for {
				off := next.Add(batch) - batch
				if off >= p.img.info.VirtualSize {
					return nil
				}
				n := min(batch, p.img.info.VirtualSize-off)
				err := src.extents(ctx, off, n, func(e extent) error {
					switch e.kind {
					case extentZero:
						return nil
					case extentCompressed:
						// A large compressed cluster is data, unless it
						// spans several output clusters that may be zero.
						if e.clen > p.img.info.ClusterSize/compressedScanRatio && p.img.info.ClusterSize <= cs {
							p.markRange(e.guest, e.length, cs)
							return nil
						}
					}
					// Extents never outgrow the batch they were asked for.
					if buf == nil {
						buf = make([]byte, batch)
					}
					b := buf[:e.length]
					if err := src.readExtent(e, b, sc); err != nil {
						return err
					}
					p.markNonZero(e.guest, b, cs)
					return nil
				})
				if err != nil {
					return err
				}
			}
		})
	}
	return g.Wait()
}

// markRange marks every output cluster touching [guest, guest+n).
func (p *Plan) markRange(guest, n, cs int64) {
	for c := guest / cs; c <= (guest+n-1)/cs; c++ {
		p.nonzero.set(c)
	}
}

// markNonZero marks the output clusters of data b (at guest offset guest)
// that hold a non-zero byte.
func (p *Plan) markNonZero(guest int64, b []byte, cs int64) {
	for len(b) > 0 {
		c := guest / cs
		n := min(int64(len(b)), (c+1)*cs-guest)
		if !isZero(b[:n]) {
			p.nonzero.set(c)
		}
		b, guest = b[n:], guest+n
	}
}

// zeros is compared against with bytes.Equal, which is vectorised.
var zeros = make([]byte, 64<<10)

// isZero reports whether b holds only zero bytes.
func isZero(b []byte) bool {
	for len(b) > 0 {
		n := min(len(b), len(zeros))
		if !bytes.Equal(b[:n], zeros[:n]) {
			return false
		}
		b = b[n:]
	}
	return true
}

// Write produces the planned output on w in one sequential pass, reading
// the image again; memory stays bounded by a few batches per reader.
//
// A regular *os.File w is emptied and written at absolute offsets from 0,
// whatever its current offset, leaving holes where the output is zero. When
// the image was opened from an *os.File too, batches are placed in
// parallel with copy_file_range (see filecopy.go) instead of in one stream.
func (p *Plan) Write(ctx context.Context, w io.Writer) error {
	out := newOutput(w)
	if err := out.presize(p.size); err != nil {
		return err
	}
	if p.opts.To == FormatQCOW2 {
		err := p.layout.writeMetadata(func(cluster int64, b []byte) error {
			if cluster*int64(len(b)) != out.n {
				return fmt.Errorf("metadata cluster %d out of order", cluster)
			}
			return out.write(b)
		})
		if err != nil {
			return err
		}
	}
	if out.file != nil && p.img.file != nil {
		if err := p.writeFile(ctx, out.file); err != nil {
			return err
		}
		return out.file.Truncate(p.size)
	}
	err := p.readBatches(ctx, func(off int64, buf []byte, n int64) error {
		if p.opts.To == FormatRaw {
			if buf == nil {
				return out.skip(n)
			}
			return out.writeData(buf)
		}
		cs := p.opts.ClusterSize
		for i := int64(0); i < int64(len(buf)); i += cs {
			if p.nonzero.has((off + i) / cs) {
				if err := out.write(buf[i : i+cs]); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := out.finish(); err != nil {
		return err
	}
	if out.n != p.size {
		return fmt.Errorf("wrote %d bytes but planned %d; the image changed during conversion", out.n, p.size)
	}
	return nil
}

// readBatches reads the guest disk in batches with Concurrency parallel
// readers and hands them to fn in guest order: n bytes at guest offset off,
// with buf nil when they are all zeros. For qcow2 output, batches without a
// non-zero cluster are skipped and buffers are padded to whole clusters.
func (p *Plan) readBatches(ctx context.Context, fn func(off int64, buf []byte, n int64) error) error {
	batch := p.batchFor()
	vsize := p.img.info.VirtualSize
	type result struct {
		off  int64
		buf  []byte
		zero bool // the batch is all holes; buf was not filled
		err  error
		done chan struct{}
	}
	depth := p.opts.Concurrency * 2
	free := make(chan []byte, depth+1)
	for range depth + 1 {
		free <- nil // buffers are allocated lazily
	}
	queue := make(chan *result, depth)
	progress := newProgressCounter(p.opts.Progress, vsize)
	scratches := newScratchPool(p.opts.Concurrency)
	defer scratches.close()
	g, ctx := errgroup.WithContext(ctx)
	readers := new(errgroup.Group)
	readers.SetLimit(p.opts.Concurrency)
	g.Go(func() error { // producer: starts reads in order
		defer close(queue)
		defer readers.Wait()
		for off := int64(0); off < vsize; off += batch {
			if p.opts.To == FormatQCOW2 && !p.singlePass && !p.nonzero.anyIn(off/p.opts.ClusterSize, batch/p.opts.ClusterSize) {
				continue
			}
			var buf []byte
			select {
			case buf = <-free:
			case <-ctx.Done():
				return ctx.Err()
			}
			if buf == nil {
				buf = make([]byte, batch)
			}
			r := &result{off: off, done: make(chan struct{})}
			n := min(batch, vsize-off)
			r.buf = buf[:n]
			if p.opts.To == FormatQCOW2 {
				r.buf = buf[:(n+p.opts.ClusterSize-1)/p.opts.ClusterSize*p.opts.ClusterSize]
				clear(r.buf[n:])
			}
			select {
			case queue <- r:
			case <-ctx.Done():
				return ctx.Err()
			}
			readers.Go(func() error {
				defer close(r.done)
				sc := scratches.get()
				defer scratches.put(sc)
				r.zero, r.err = p.readBatch(ctx, off, r.buf[:n], sc)
				if p.singlePass && !r.zero && r.err == nil {
					p.markNonZero(off, r.buf[:n], p.opts.ClusterSize)
				}
				return nil
			})
		}
		return nil
	})
	var done int64      // guest bytes handed to fn, or skipped before them
	g.Go(func() error { // consumer: hands batches to fn in order
		var err error
		for r := range queue {
			<-r.done
			if r.err != nil {
				return r.err
			}
			if r.zero {
				err = fn(r.off, nil, int64(len(r.buf)))
			} else {
				err = fn(r.off, r.buf, int64(len(r.buf)))
			}
			if err != nil {
				return err
			}
			end := min(r.off+batch, vsize)
			progress.add(end - done)
			done = end
			free <- r.buf[:cap(r.buf)]
		}
		return nil
	})
	if err := g.Wait(); err != nil {
		return err
	}
	if done < vsize { // batches of holes at the end were skipped
		progress.add(vsize - done)
	}
	return nil
}

// readBatch fills buf with the guest data at off. A batch that is one hole
// is reported as zero and buf is left alone, unless a plan decided to store
// clusters of it (stream qcow2 output, whose size was fixed by the scan).
func (p *Plan) readBatch(ctx context.Context, off int64, buf []byte, sc *scratch) (zero bool, err error) {
	var exts []extent
	err = p.img.src.extents(ctx, off, int64(len(buf)), func(e extent) error {
		exts = append(exts, e)
		return nil
	})
	if err != nil {
		return false, err
	}
	if (p.opts.To == FormatRaw || p.singlePass) && len(exts) == 1 && exts[0].kind == extentZero {
		return true, nil
	}
	for _, e := range exts {
		if err := p.img.src.readExtent(e, buf[e.guest-off:e.guest-off+e.length], sc); err != nil {
			return false, err
		}
	}
	return false, nil
}
