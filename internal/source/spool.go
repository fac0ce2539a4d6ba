package source

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/imagepipe/imagepipe/internal/reject"
)

// DefaultMaxSpool is the default of Options.MaxSpool: the most bytes Open
// writes to Options.TempDir for one image. 64 GiB holds the data of every
// common cloud image (a few GiB) and of most full installed disks, while a
// decompression bomb or a hostile download stops long before it fills an
// ordinary /tmp on a build host or a CI runner. Larger images are imported
// with a higher cap (imagectl --max-spool) or, better, from a local
// unwrapped file, which is never copied.
const DefaultMaxSpool int64 = 64 << 30

// SpoolMargin is the free space Open leaves in Options.TempDir: spooling
// stops before the file system would have less than this many bytes free.
const SpoolMargin int64 = 64 << 20

// spaceCheckInterval is how many bytes are spooled between two looks at the
// free space of the temporary directory. It is well below SpoolMargin, so
// the margin is never eaten between two looks.
const spaceCheckInterval = 8 << 20

// streamHead and streamTail are how many leading and trailing bytes of a
// streamed image (Options.StreamRaw) are kept for format detection; the
// disk engine's detection reads only the first 64 KiB and the last 512
// bytes of a raw image.
const (
	streamHead = 1 << 20
	streamTail = 64 << 10
)

// ErrNotSpooled is returned by the ReaderAt of a streamed image
// (Options.StreamRaw) for bytes that were neither in its head nor its tail.
var ErrNotSpooled = errors.New("the image was streamed, not spooled; only its first and last bytes can be read again")

// SpaceError reports that the temporary directory has too little free space
// for a spool. Nothing of the spool is left behind.
type SpaceError struct {
	// Dir is the temporary directory.
	Dir string
	// Need is the number of bytes the spool needs; -1 when the final size
	// is not known (a compressed or unannounced stream).
	Need int64
	// Spooled is the number of bytes written before the spool stopped.
	Spooled int64
	// Available is the free space of Dir's file system, for an unprivileged
	// user, when the spool stopped.
	Available int64
}

func (e *SpaceError) Error() string {
	if e.Need >= 0 {
		return fmt.Sprintf("the temporary directory %s has %d bytes free; spooling this image needs %d bytes plus a margin of %d bytes",
			e.Dir, e.Available, e.Need, SpoolMargin)
	}
	return fmt.Sprintf("the temporary directory %s is nearly full: %d bytes free after spooling %d bytes of the image, and at least %d bytes must stay free",
		e.Dir, e.Available, e.Spooled, SpoolMargin)
}

// spoolCapError rejects an image whose spool would pass Options.MaxSpool.
func spoolCapError(size, limit int64) error {
	if size >= 0 {
		return &reject.Error{
			Reason: reject.SpoolLimit,
			Detail: fmt.Sprintf("the image is %d bytes and would have to be copied to a temporary file, over the spool limit of %d bytes", size, limit),
		}
	}
	return &reject.Error{
		Reason: reject.SpoolLimit,
		Detail: fmt.Sprintf("the image needs more than the spool limit of %d bytes of temporary space", limit),
	}
}

// tempDir is the directory spools go to.
func (o *config) tempDir() string {
	if o.TempDir != "" {
		return o.TempDir
	}
	return os.TempDir()
}

// freeSpace returns the bytes an unprivileged user may still write to the
// file system of dir.
func freeSpace(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("checking the free space of %s: %w", dir, err)
	}
	avail := st.Bavail * uint64(st.Bsize)
	if avail > 1<<62 {
		avail = 1 << 62
	}
	return int64(avail), nil
}

// checkSpace fails unless dir has need bytes free beyond SpoolMargin.
func (o *config) checkSpace(need int64) error {
	dir := o.tempDir()
	avail, err := o.freeSpace(dir)
	if err != nil {
		return err
	}
	if need > avail-SpoolMargin {
		return &SpaceError{Dir: dir, Need: need, Available: avail}
	}
	return nil
}

// spoolGuard sits between the unwrapped stream and convert.Spool: it stops
// the spool with an error once more than limit bytes arrive, and looks at
// the free space of the temporary directory every spaceCheckInterval bytes.
// The reader sees each byte before it is written, so a refusal comes before
// the write that would pass the cap or the margin.
type spoolGuard struct {
	r         io.Reader
	o         *config
	limit     int64
	n         int64
	nextCheck int64
	err       error // why the guard stopped the spool
}

func (g *spoolGuard) Read(p []byte) (int, error) {
	if g.err != nil {
		return 0, g.err
	}
	n, err := g.r.Read(p)
	if n == 0 {
		return n, err
	}
	if g.n+int64(n) > g.limit {
		g.err = spoolCapError(-1, g.limit)
		return 0, g.err
	}
	if g.n+int64(n) > g.nextCheck {
		dir := g.o.tempDir()
		avail, serr := g.o.freeSpace(dir)
		if serr != nil {
			g.err = serr
			return 0, g.err
		}
		if avail-SpoolMargin < spaceCheckInterval+int64(n) {
			g.err = &SpaceError{Dir: dir, Need: -1, Spooled: g.n, Available: avail}
			return 0, g.err
		}
		g.nextCheck = g.n + spaceCheckInterval
	}
	g.n += int64(n)
	return n, err
}

// needsRandomAccess reports whether an unwrapped image starting with head
// must be spooled for the disk engine: qcow2 (and qcow v1, rejected from
// its header) keeps tables anywhere in the file. Everything else is judged
// raw or rejected from its first and last bytes.
func needsRandomAccess(head []byte) bool {
	return bytes.HasPrefix(head, []byte("QFI\xfb"))
}

// streamView is the ReaderAt of a streamed image: the bytes of its head and
// its tail, and ErrNotSpooled for anything in between.
type streamView struct {
	head    []byte
	tail    []byte
	tailOff int64
	size    int64
}

func (v *streamView) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, errors.New("negative offset")
	}
	done := 0
	for done < len(p) {
		pos := off + int64(done)
		switch {
		case pos >= v.size:
			return done, io.EOF
		case pos < int64(len(v.head)):
			done += copy(p[done:], v.head[pos:])
		case pos >= v.tailOff:
			done += copy(p[done:], v.tail[pos-v.tailOff:])
		default:
			return done, fmt.Errorf("reading byte %d: %w", pos, ErrNotSpooled)
		}
	}
	return done, nil
}

// tailKeeper remembers the last streamTail bytes written to it.
type tailKeeper struct{ buf []byte }

func (t *tailKeeper) keep(p []byte) {
	if len(p) >= streamTail {
		t.buf = append(t.buf[:0], p[len(p)-streamTail:]...)
		return
	}
	t.buf = append(t.buf, p...)
	if len(t.buf) > 2*streamTail {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-streamTail:]...)
	}
}

func (t *tailKeeper) bytes() []byte {
	if len(t.buf) > streamTail {
		return t.buf[len(t.buf)-streamTail:]
	}
	return t.buf
}

// dataBlock is the granularity at which a streamed image's data is counted,
// the same as a spool's holes (4 KiB blocks of zeros).
const dataBlock = 4 << 10

// countData returns the bytes of b in 4 KiB blocks (counted from the start
// of b) that are not all zeros.
func countData(b []byte) int64 {
	var zero [dataBlock]byte
	var n int64
	for len(b) > 0 {
		blk := b[:min(len(b), dataBlock)]
		if !bytes.Equal(blk, zero[:len(blk)]) {
			n += int64(len(blk))
		}
		b = b[len(blk):]
	}
	return n
}

// freeSpaceHook is what new configs use to look at free space; tests
// replace it.
var freeSpaceHook = freeSpace
