package source

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/imagepipe/imagepipe/internal/convert"
	"github.com/imagepipe/imagepipe/internal/reject"
)

// This file holds the xz program writing a spool itself (spoolXZ), and the
// helpers it shares with the program decoding for a reader (xzread.go).

// xzSpaceLook is how often spoolXZ looks at the free space of the temporary
// directory while the xz program writes the spool. xz writes at most a few
// GB/s (zeros cost nothing, being holes), so SpoolMargin absorbs what it
// writes between two looks.
const xzSpaceLook = 10 * time.Millisecond

// spoolXZ decodes the xz stream r with the xz program at path straight into
// a sparse temporary file, the spool: about as fast as `xz -dc > FILE`, since
// the decompressed bytes never cross a pipe (through a pipe, the program
// spends more time writing than decoding zeros), and faster than `xz -dc` on
// multi-block files, which it decodes with a thread per core. A stream r is
// fed to the program through a pipe, so its bytes pass the hasher as any
// source's do; a local *os.File r at offset 0 is the program's standard
// input itself, read as `xz -dc FILE` reads it, and Options.Progress follows
// the program's position in it (the caller hashes the file alongside).
//
// The bounds on untrusted input are those of any spool:
//   - MaxSize and MaxSpool: the program runs under a file size limit
//     (RLIMIT_FSIZE) of the smaller of the two, so the kernel stops a
//     decompression bomb at the cap, holes included;
//   - free space: looked at every xzSpaceLook, and the program is stopped
//     once less than SpoolMargin plus spaceCheckInterval stays free;
//   - memory: the program's is bounded by the stream's dictionary size
//     (64 MiB for xz -9, at most 1.5 GiB for a hostile stream, as with the
//     Go decoder); its multi-threaded decoder falls back to one thread rather
//     than pass xz's default memory limit for threads.
//
// XZ_DEFAULTS and XZ_OPT are cleared, so the user's settings for compression
// cannot change decoding. The spool then gets holes for its 4 KiB blocks of
// zeros (punchZeroBlocks), as convert.Spool leaves them, so the image is the
// same whichever decoder made it.
func (o *config) spoolXZ(ctx context.Context, path string, r io.Reader) (*Image, error) {
	dir := o.tempDir()
	avail, err := o.freeSpace(dir)
	if err != nil {
		return nil, err
	}
	if avail-SpoolMargin < spaceCheckInterval {
		return nil, &SpaceError{Dir: dir, Need: -1, Available: avail}
	}
	f, temp, err := createTemp(o.TempDir)
	if err != nil {
		return nil, err
	}
	img := &Image{ReaderAt: f, Wrapper: convert.WrapperXZ, file: f, temp: temp}
	if img.Size, err = o.runXZ(ctx, path, r, f); err != nil {
		img.Close()
		return nil, err
	}
	if err := punchZeroBlocks(f, img.Size); err != nil {
		img.Close()
		return nil, fmt.Errorf("spooling the decompressed image: %w", err)
	}
	var head [8]byte
	n, _ := f.ReadAt(head[:], 0)
	if nested := convert.DetectWrapper(head[:n]); nested != convert.WrapperNone {
		img.Close()
		return nil, reject.New(reject.Wrapper, "the xz stream holds another %s stream; decompress it once before uploading", nested)
	}
	return img, nil
}

// errXZNotStarted is runXZ's error when the program did not start or could
// not be limited, having read nothing: another decoder can still take the
// stream.
var errXZNotStarted = errors.New("the xz program did not start")

// runXZ runs the xz program at path with r as its input and the empty file
// spool as its output, and returns the decompressed size. An *os.File r is
// the program's standard input itself; any other r is fed to it through a
// pipe.
func (o *config) runXZ(ctx context.Context, path string, r io.Reader, spool *os.File) (int64, error) {
	run, err := o.startSpoolXZ(path, r, spool)
	if err != nil {
		return 0, err
	}
	fed := run.feed(r)
	endWatch := run.watch(ctx)
	werr := run.cmd.Wait()
	stopped := endWatch()
	feedErr := <-fed

	switch {
	case stopped != nil:
		return 0, stopped
	case feedErr != nil:
		// The source failed; whatever xz made of its bytes so far, the
		// image is not complete.
		return 0, fmt.Errorf("reading the xz stream: %w", feedErr)
	case werr != nil:
		return 0, o.xzFailure(werr, run.stderr.String())
	}
	st, err := spool.Stat()
	if err != nil {
		return 0, fmt.Errorf("spooling the decompressed image: %w", err)
	}
	if st.Size() > run.limit {
		return 0, o.capError()
	}
	if run.direct && o.Progress != nil {
		o.Progress(run.inputSize, run.inputSize) // the program read it all
	}
	return st.Size(), nil
}

// xzSpoolRun is the xz program at work on a spool, started by startSpoolXZ.
type xzSpoolRun struct {
	o     *config
	cmd   *exec.Cmd
	spool *os.File
	// limit is the program's file size limit: MaxSize or MaxSpool,
	// whichever is smaller.
	limit int64
	// direct is set when the program reads a local file itself, whose size
	// inputSize is (-1 if unknown); stdin is the pipe that feeds it
	// otherwise.
	direct    bool
	inputSize int64
	stdin     io.WriteCloser
	stderr    cappedBuffer
}

// startSpoolXZ starts the xz program at path with spool as its output and
// r as its input (an *os.File r as its standard input itself, any other
// through a pipe), and sets its limits before it has read anything. Its
// error wraps errXZNotStarted when the program did not start or could not
// be limited.
func (o *config) startSpoolXZ(path string, r io.Reader, spool *os.File) (*xzSpoolRun, error) {
	x := &xzSpoolRun{o: o, spool: spool, limit: min(o.maxSize, o.maxSpool), inputSize: -1}
	x.cmd = exec.Command(path, "--decompress", "--stdout", "--threads=0")
	x.cmd.Env = xzEnv(os.Environ())
	x.cmd.Stdout = spool
	x.cmd.Stderr = &x.stderr
	var file *os.File
	if file, x.direct = r.(*os.File); x.direct {
		x.cmd.Stdin = file
		if st, err := file.Stat(); err == nil {
			x.inputSize = st.Size()
		}
	} else {
		var err error
		if x.stdin, err = x.cmd.StdinPipe(); err != nil {
			return nil, fmt.Errorf("starting xz: %w", err)
		}
	}
	if err := x.cmd.Start(); err != nil {
		closeIfSet(x.stdin)
		return nil, fmt.Errorf("%w: %w", errXZNotStarted, err)
	}
	// The limits are set before a piped program has any input, so before
	// it can write a byte. A program reading a file directly could in
	// theory write a buffer or two in the microseconds before; the kernel
	// stops every later write past the cap whatever came before, and the
	// size is checked again at the end. No core file when the limit stops
	// the program.
	if err := limitXZ(x.cmd.Process.Pid, x.limit); err != nil {
		// E.g. a user's own hard limit below the cap, which only root may
		// raise. The program has read nothing yet: startXZ, whose reader
		// counts the cap itself, takes the stream.
		_ = x.cmd.Process.Kill()
		closeIfSet(x.stdin)
		_ = x.cmd.Wait()
		return nil, fmt.Errorf("%w: limiting its file size: %w", errXZNotStarted, err)
	}
	return x, nil
}

// feed feeds a piped program the compressed bytes of r, at most MaxSize of
// them (spool's drain tells a longer source apart), from a goroutine of its
// own. The channel gives the error reading r, if any, once the feeding is
// done; for a program reading a file itself, nil at once.
func (x *xzSpoolRun) feed(r io.Reader) <-chan error {
	fed := make(chan error, 1)
	if x.direct {
		fed <- nil
		return fed
	}
	go func() {
		src := &readErrReader{r: io.LimitReader(r, x.o.maxSize+1)}
		_, _ = io.Copy(x.stdin, src) // a failed write means the program has gone, which Wait tells about
		x.stdin.Close()
		fed <- src.err
	}()
	return fed
}

// watch looks at the free space (and reports progress) every xzSpaceLook,
// and watches ctx, while the program writes; either stops the program. The
// returned function, called once the program has exited, ends the watch and
// returns why it stopped the program, if it did.
func (x *xzSpoolRun) watch(ctx context.Context) (end func() error) {
	var stopped error // read after watched is closed
	done, watched := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		tick := time.NewTicker(xzSpaceLook)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				stopped = ctx.Err()
			case <-tick.C:
				if stopped = x.look(); stopped == nil {
					continue
				}
			}
			_ = x.cmd.Process.Kill()
			return
		}
	}()
	return func() error {
		close(done)
		<-watched
		return stopped
	}
}

// look reports the program's progress through a file it reads itself, and
// returns an error when the temporary directory is too full to go on.
func (x *xzSpoolRun) look() error {
	o := x.o
	if x.direct && o.Progress != nil {
		if pos, ok := inputPosition(x.cmd.Process.Pid); ok {
			o.Progress(pos, x.inputSize)
		}
	}
	avail, err := o.freeSpace(o.tempDir())
	switch {
	case err != nil:
		return err
	case avail-SpoolMargin < spaceCheckInterval:
		var st unix.Stat_t
		_ = unix.Fstat(int(x.spool.Fd()), &st)
		return &SpaceError{Dir: o.tempDir(), Need: -1, Spooled: st.Blocks * 512, Available: avail}
	}
	return nil
}

// limitXZ sets the file size limit of the xz program pid to limit bytes,
// and its core file limit to 0; tests replace it.
var limitXZ = func(pid int, limit int64) error {
	err := unix.Prlimit(pid, unix.RLIMIT_FSIZE, &unix.Rlimit{Cur: uint64(limit), Max: uint64(limit)}, nil)
	if err == nil {
		err = unix.Prlimit(pid, unix.RLIMIT_CORE, &unix.Rlimit{}, nil)
	}
	return err
}

// inputPosition reads the position of process pid in its standard input
// from /proc.
func inputPosition(pid int) (int64, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/0", pid))
	if err != nil {
		return 0, false
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "pos:"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// xzFailure is the error of an xz run that ended with werr, having printed
// stderr.
func (o *config) xzFailure(werr error, stderr string) error {
	var ee *exec.ExitError
	if errors.As(werr, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGXFSZ {
			return o.capError()
		}
		if ee.ExitCode() < 0 {
			// Ended by a signal this process did not send (e.g. by the OOM
			// killer): no verdict on the image.
			return fmt.Errorf("the xz program stopped: %w", werr)
		}
	}
	line, _, _ := strings.Cut(strings.TrimSpace(stderr), "\n")
	// "/usr/bin/xz: (stdin): Compressed data is corrupt"
	msg := line
	if _, after, ok := strings.Cut(line, "(stdin): "); ok {
		msg = after
	}
	switch {
	case strings.Contains(msg, "File too large"):
		// The file size limit, where SIGXFSZ is ignored.
		return o.capError()
	case strings.Contains(msg, "Unexpected end of input"):
		return reject.New(reject.Wrapper, "the xz stream ends before its end marker (truncated)")
	case msg == "":
		return reject.New(reject.Wrapper, "the xz stream is corrupt: xz: %v", werr)
	}
	return reject.New(reject.Wrapper, "the xz stream is corrupt: xz: %s", strings.ToLower(msg[:1])+msg[1:])
}

// capError rejects an image that expands past MaxSize or MaxSpool,
// whichever is smaller, as the spool of any other stream would.
func (o *config) capError() error {
	if o.maxSpool <= o.maxSize {
		return spoolCapError(-1, o.maxSpool)
	}
	return o.wordCap(reject.New(reject.Wrapper, "the decompressed image exceeds %d bytes", o.maxSize), convert.WrapperXZ)
}

// punchZeroBlocks makes holes of the 4 KiB blocks of zeros (counted from
// the start of f) that the first size bytes of f hold as data: xz leaves
// only whole 8 KiB buffers of zeros as holes, convert.Spool every 4 KiB
// block. A file system that cannot punch holes keeps the zeros.
func punchZeroBlocks(f *os.File, size int64) error {
	fd := int(f.Fd())
	buf := make([]byte, 1<<20)
	for pos := int64(0); pos < size; {
		data, err := unix.Seek(fd, pos, unix.SEEK_DATA)
		switch {
		case errors.Is(err, unix.ENXIO): // no data after pos
			return nil
		case errors.Is(err, unix.EINVAL): // no SEEK_DATA here: all data
			data = pos
		case err != nil:
			return fmt.Errorf("finding data: %w", err)
		}
		end, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			end = size
		}
		data -= data % dataBlock
		for data < min(end, size) {
			n, err := f.ReadAt(buf[:min(int64(len(buf)), min(end, size)-data)], data)
			if n == 0 && err != nil {
				return fmt.Errorf("reading the spool: %w", err)
			}
			if err := punchZeros(fd, buf[:n], data); err != nil {
				return nil // holes are an optimisation; keep the zeros
			}
			data += int64(n)
		}
		pos = end
	}
	return nil
}

// punchZeros punches a hole for each run of 4 KiB blocks of zeros of b,
// which f holds at off (a multiple of 4 KiB).
func punchZeros(fd int, b []byte, off int64) error {
	run := -1 // start of the current run of zero blocks
	flush := func(i int) error {
		if run < 0 {
			return nil
		}
		err := unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off+int64(run), int64(i-run))
		run = -1
		return err
	}
	var zero [dataBlock]byte
	for i := 0; i < len(b); i += dataBlock {
		blk := b[i:min(i+dataBlock, len(b))]
		if bytes.Equal(blk, zero[:len(blk)]) {
			if run < 0 {
				run = i
			}
			continue
		}
		if err := flush(i); err != nil {
			return err
		}
	}
	return flush(len(b))
}

// xzStderrMax is how much of xz's standard error is kept for the message of
// a failure: its first lines say what went wrong.
const xzStderrMax = 4 << 10

// readErrReader remembers the first error of r other than io.EOF.
type readErrReader struct {
	r   io.Reader
	err error
}

func (e *readErrReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) && e.err == nil {
		e.err = err
	}
	return n, err
}

// cappedBuffer keeps the first xzStderrMax bytes written to it. exec
// writes to it from a goroutine of its own; read it after Wait.
type cappedBuffer struct {
	buf bytes.Buffer
}

func (c *cappedBuffer) Write(p []byte) (int, error) {
	if room := xzStderrMax - c.buf.Len(); room > 0 {
		c.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (c *cappedBuffer) String() string { return c.buf.String() }
