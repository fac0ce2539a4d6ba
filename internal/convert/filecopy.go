package convert

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"os"
	"sync"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/imagepipe/imagepipe/internal/reject"
)

// File-to-file conversion.
//
// When both the image and the output are regular files, Write does not need
// one sequential stream: every byte's output position is known from the
// plan. Batches are then processed in parallel and placed with positional
// writes, and uncompressed data moves with copy_file_range, which copies
// inside the kernel instead of through a user-space buffer. Ranges that are
// never written stay holes of the presized output file and read as zeros.
// Raw output written this way keeps holes where the input has them, but does
// not turn allocated blocks of zeros into holes.

// rankGroup is the number of clusters per entry of the rank index.
const rankGroup = 4096

// rankIndex answers "how many non-zero clusters come before cluster c", the
// position of c's data in a qcow2 output, in O(rankGroup/64) time.
type rankIndex struct {
	b      bitmap
	prefix []int64 // set bits before each group of rankGroup clusters
}

func newRankIndex(b bitmap) *rankIndex {
	wordsPerGroup := rankGroup / 64
	r := &rankIndex{b: b, prefix: make([]int64, len(b)/wordsPerGroup+1)}
	var n int64
	for i, w := range b {
		if i%wordsPerGroup == 0 {
			r.prefix[i/wordsPerGroup] = n
		}
		n += int64(bits.OnesCount64(w))
	}
	return r
}

func (r *rankIndex) rank(c int64) int64 {
	n := r.prefix[c/rankGroup]
	for w := c / rankGroup * (rankGroup / 64); w < c/64; w++ {
		n += int64(bits.OnesCount64(r.b[w]))
	}
	return n + int64(bits.OnesCount64(r.b[c/64]&(1<<(c%64)-1)))
}

// writeFile places the guest data of every batch into out.file, with
// Concurrency batches in flight. The qcow2 metadata is already written.
func (p *Plan) writeFile(ctx context.Context, out *os.File) error {
	var ranks *rankIndex
	if p.opts.To == FormatQCOW2 {
		ranks = newRankIndex(p.nonzero)
	}
	batch := p.batchFor()
	vsize := p.img.info.VirtualSize
	cs := p.opts.ClusterSize
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(p.opts.Concurrency)
	scratches := newScratchPool(p.opts.Concurrency)
	defer scratches.close()
	// Writes to one file serialise on its inode lock in the kernel, where
	// waiters spin; taking turns here instead leaves the CPU to readers and
	// decompressors.
	var writeMu sync.Mutex
	progress := newProgressCounter(p.opts.Progress, vsize)
	for off := int64(0); off < vsize; off += batch {
		if err := ctx.Err(); err != nil {
			break
		}
		if ranks != nil && !p.nonzero.anyIn(off/cs, batch/cs) {
			progress.add(min(batch, vsize-off))
			continue
		}
		g.Go(func() error {
			defer func() { progress.add(min(batch, vsize-off)) }()
			sc := scratches.get()
			defer scratches.put(sc)
			pending := &rangeCopier{in: p.img.file, out: out, sc: sc, mu: &writeMu}
			err := p.img.src.extents(ctx, off, min(batch, vsize-off), func(e extent) error {
				if e.kind == extentZero {
					return nil
				}
				place, err := p.placer(out, e, pending)
				if err != nil {
					return err
				}
				if ranks == nil { // raw output: guest offset = file offset
					return place(e.guest, e.length, e.guest)
				}
				// qcow2 output: split at output clusters, skip zero ones.
				for pos := e.guest; pos < e.guest+e.length; {
					c := pos / cs
					n := min(e.guest+e.length, (c+1)*cs) - pos
					if p.nonzero.has(c) {
						at := (p.layout.dataStart()+ranks.rank(c))*cs + pos - c*cs
						if err := place(pos, n, at); err != nil {
							return err
						}
					}
					pos += n
				}
				return nil
			})
			if err != nil {
				return err
			}
			return pending.flush()
		})
	}
	return g.Wait()
}

// placer returns a function that writes n guest bytes of extent e, from
// guest offset guest, to the output file at offset at. A compressed extent
// is decompressed once, here, however many pieces it is written in.
func (p *Plan) placer(out *os.File, e extent, pending *rangeCopier) (func(guest, n, at int64) error, error) {
	if e.kind == extentData {
		return func(guest, n, at int64) error {
			return pending.add(e.host+(guest-e.guest), at, n)
		}, nil
	}
	sc := pending.sc
	if int64(len(sc.extent)) < e.length {
		sc.extent = make([]byte, max(e.length, p.img.info.ClusterSize))
	}
	data := sc.extent[:e.length]
	if err := p.img.src.readExtent(e, data, sc); err != nil {
		return nil, err
	}
	return func(guest, n, at int64) error {
		pending.mu.Lock()
		defer pending.mu.Unlock()
		allocate(out, at, n)
		_, err := out.WriteAt(data[guest-e.guest:guest-e.guest+n], at)
		return err
	}, nil
}

// rangeCopier merges copies of neighbouring ranges, so a run of data
// clusters costs one copy_file_range call, not one per cluster.
type rangeCopier struct {
	in, out    *os.File
	sc         *scratch
	mu         *sync.Mutex // held while writing to out
	src, at, n int64       // the pending copy
}

func (c *rangeCopier) add(src, at, n int64) error {
	if c.n > 0 && c.src+c.n == src && c.at+c.n == at {
		c.n += n
		return nil
	}
	if err := c.flush(); err != nil {
		return err
	}
	c.src, c.at, c.n = src, at, n
	return nil
}

func (c *rangeCopier) flush() error {
	if c.n == 0 {
		return nil
	}
	c.mu.Lock()
	allocate(c.out, c.at, c.n)
	err := copyRange(c.in, c.src, c.out, c.at, c.n, c.sc)
	c.mu.Unlock()
	c.n = 0
	return err
}

// allocate reserves disk blocks for a range about to be written, in one
// call instead of block by block as delayed allocation does during the
// writes. It is only an optimisation: errors (a filesystem without
// fallocate, a full disk) surface from the write itself.
func allocate(f *os.File, at, n int64) {
	_ = unix.Fallocate(int(f.Fd()), 0, at, n)
}

// copyRange copies n bytes from in at off to out at at, inside the kernel
// when the filesystem allows it, through a buffer otherwise.
func copyRange(in *os.File, off int64, out *os.File, at, n int64, sc *scratch) error {
	for n > 0 {
		k, err := unix.CopyFileRange(int(in.Fd()), &off, int(out.Fd()), &at, int(n), 0)
		if err != nil {
			if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP) {
				return copyBuffered(in, off, out, at, n, sc)
			}
			return err
		}
		if k == 0 { // the input ends early: the rest stays a hole (zeros)
			return nil
		}
		n -= int64(k)
	}
	return nil
}

func copyBuffered(in *os.File, off int64, out *os.File, at, n int64, sc *scratch) error {
	if len(sc.comp) < batchSize {
		sc.comp = make([]byte, batchSize)
	}
	for n > 0 {
		b := sc.comp[:min(n, int64(len(sc.comp)))]
		if err := readFull(in, b, off); err != nil {
			return err
		}
		if _, err := out.WriteAt(b, at); err != nil {
			return err
		}
		off, at, n = off+int64(len(b)), at+int64(len(b)), n-int64(len(b))
	}
	return nil
}

// WriteFile converts img into f, a regular file, and returns the size of
// the result. It needs no size up front, so qcow2 output takes one pass
// over the image: each batch is read once, checked for zero clusters and
// written straight to its place, data first and the tables after (see
// qcowLayout). Raw output goes through Plan and Write. f is emptied first.
//
// WriteFile runs Verify's walk first and decompresses while it writes, so a
// compressed image is decompressed once, not twice. A fault found while
// writing returns Verify's rejection, the verdict every command gives; f
// then holds partial output for the caller to discard.
func (img *Image) WriteFile(ctx context.Context, f *os.File, opts Options) (int64, error) {
	n, err := img.writeFile(ctx, f, opts)
	if reject.As(err) != nil {
		// A fault found while writing: Verify's verdict, so that every
		// command gives the same one for the same bytes.
		if _, verr := img.Verify(ctx); verr != nil {
			return 0, verr
		}
	}
	return n, err
}

func (img *Image) writeFile(ctx context.Context, f *os.File, opts Options) (int64, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return 0, err
	}
	// The walk's checks first; decompression checks come as clusters
	// are written.
	if _, err := img.walk(ctx); err != nil {
		return 0, err
	}
	if opts.To == FormatRaw {
		p, err := img.plan(ctx, opts)
		if err != nil {
			return 0, err
		}
		return p.Size(), p.Write(ctx, f)
	}
	if st, err := f.Stat(); err != nil || st.Size() > 0 {
		if err := f.Truncate(0); err != nil {
			return 0, err
		}
	}
	cs := opts.ClusterSize
	vsize := img.qcow2VirtualSize()
	p := &Plan{img: img, opts: opts, nonzero: newBitmap(ceilDiv(vsize, cs)), singlePass: true}
	next := int64(1) // the next data cluster; cluster 0 is the header
	err = p.readBatches(ctx, func(off int64, buf []byte, n int64) error {
		// Runs of non-zero clusters are contiguous in buf and in the
		// file: one write each.
		for i := int64(0); i < int64(len(buf)); {
			if !p.nonzero.has((off + i) / cs) {
				i += cs
				continue
			}
			j := i + cs
			for j < int64(len(buf)) && p.nonzero.has((off+j)/cs) {
				j += cs
			}
			allocate(f, next*cs, j-i)
			if _, err := f.WriteAt(buf[i:j], next*cs); err != nil {
				return err
			}
			next += (j - i) / cs
			i = j
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	layout := newQCOWLayout(vsize, cs, p.nonzero, true)
	if layout.data != next-1 {
		return 0, fmt.Errorf("wrote %d data clusters but counted %d", next-1, layout.data)
	}
	err = layout.writeMetadata(func(cluster int64, b []byte) error {
		_, err := f.WriteAt(b, cluster*cs)
		return err
	})
	if err != nil {
		return 0, err
	}
	return layout.fileSize(), f.Truncate(layout.fileSize())
}
