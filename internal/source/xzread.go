package source

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// This file holds the xz program's second use: decoding for a reader, for
// Options.StreamRaw (imagectl inspect), which must write nothing to the
// temporary directory, so that a decompression bomb is judged without the
// disk it would fill, and wherever spoolXZ cannot limit the program.

// startXZ decodes the xz stream compressed with the program at path for a
// reader, several times faster than the pure-Go decoder and about as fast
// as `xz -dc > /dev/null` (faster on multi-block files, which it decodes
// with a thread per core). The program writes into a memory file read
// behind it (xzRing), or into a pipe where no memory file can be made. It
// returns nil, having read nothing, when the program does not start, and
// the caller decodes the stream itself.
//
// A local *os.File compressed (at offset 0) is the program's standard
// input itself, read as `xz -dc FILE` reads it, and progress, when not nil,
// follows the program's position in it (with a memory file); any other
// stream is fed to it through a pipe from a goroutine of its own, and its
// reader reports progress. The bounds on untrusted input stay those of the
// caller, which counts and caps the decompressed bytes as it reads them;
// the memory file holds at most xzRingMax bytes not yet read; the
// program's memory is bounded by the stream's dictionary size (64 MiB for
// xz -9, at most 1.5 GiB for a hostile stream, as with the Go decoder), and
// its multi-threaded decoder falls back to one thread rather than pass xz's
// default memory limit for threads. XZ_DEFAULTS and XZ_OPT are cleared, so
// the user's settings for compression cannot change decoding. The program
// is killed if this process dies first (it may be stopped by xzRing, and
// would stay so).
func startXZ(path string, compressed io.Reader, progress func(done, total int64)) *xzReader {
	cmd := exec.Command(path, "--decompress", "--stdout", "--threads=0")
	cmd.Env = xzEnv(os.Environ())
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	file, direct := compressed.(*os.File)
	var stdin io.WriteCloser
	var err error
	if direct {
		cmd.Stdin = file
	} else if stdin, err = cmd.StdinPipe(); err != nil {
		return nil
	}
	x := &xzReader{cmd: cmd, fed: make(chan struct{})}
	var ringOut *os.File // the memory file as the program's output
	if !xzRingOff {
		ringOut, x.ring = newXZRing(cmd)
	}
	if x.ring != nil {
		x.out = x.ring
	} else {
		if x.stdout, err = cmd.StdoutPipe(); err != nil {
			closeIfSet(stdin)
			return nil
		}
		growPipe(x.stdout)
		x.out = x.stdout
	}
	// Larger pipes than the default 64 KiB: fewer switches between xz and
	// this process, which matter at a GiB per second of zeros.
	if stdin != nil {
		growPipe(stdin)
	}
	cmd.Stderr = &x.stderr
	err = cmd.Start()
	if ringOut != nil {
		ringOut.Close() // the program has its own copy
	}
	if err != nil {
		closeIfSet(stdin)
		if x.ring != nil {
			x.ring.closeUnstarted()
		} else {
			x.stdout.Close()
		}
		return nil
	}
	if x.ring != nil {
		x.ring.watch(cmd)
	}
	if direct {
		if x.ring != nil && progress != nil {
			total := int64(-1)
			if st, err := file.Stat(); err == nil {
				total = st.Size()
			}
			x.ring.progress = func(exited bool) {
				if exited {
					progress(total, total) // the program read it all
				} else if pos, ok := inputPosition(cmd.Process.Pid); ok {
					progress(pos, total)
				}
			}
		}
		close(x.fed)
		return x
	}
	go func() {
		defer close(x.fed)
		// A failed write means the program has gone, which Wait tells
		// about; only a failure to read the source is the feed's own.
		src := &readErrReader{r: compressed}
		_, _ = io.Copy(stdin, src)
		x.feedErr = src.err
		stdin.Close()
	}()
	return x
}

// closeIfSet closes c unless it is nil.
func closeIfSet(c io.Closer) {
	if c != nil {
		c.Close()
	}
}

// xzRingOff makes startXZ use a pipe, as where no memory file can be
// made; tests set it.
var xzRingOff bool

// xzPipeSize is the size asked for the pipes to and from xz; Linux's
// default limit for an unprivileged process (pipe-max-size) is 1 MiB.
const xzPipeSize = 1 << 20

// growPipe asks for a pipe of xzPipeSize; where that fails the pipe keeps
// its size.
func growPipe(p any) {
	f, ok := p.(interface {
		SyscallConn() (syscall.RawConn, error)
	})
	if !ok {
		return
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		_, _ = unix.FcntlInt(fd, unix.F_SETPIPE_SZ, xzPipeSize)
	})
}

// xzReader is the output of a running xz program. Read returns io.EOF only
// once the program has exited successfully, having read all of its input;
// a failure of the program is an error naming what it said.
type xzReader struct {
	cmd    *exec.Cmd
	out    io.Reader     // the program's output: ring or stdout
	ring   *xzRing       // the memory file it writes to, or nil
	stdout io.ReadCloser // the pipe it writes to, when ring is nil
	stderr cappedBuffer
	fed    chan struct{} // closed when the feeding goroutine is done
	// feedErr is the error reading the compressed stream, if any; read it
	// after fed is closed.
	feedErr error

	err       error // the sticky result of Read once the output ended
	closeOnce sync.Once
	waited    bool // the program was waited for (with a pipe; the ring waits itself)
	// toolErr is set when the program failed for a reason of its own (it
	// was killed, e.g. by the OOM killer), not because of the stream: no
	// verdict on the image. Read it after Read returned an error.
	toolErr error
}

func (x *xzReader) Read(p []byte) (int, error) {
	if x.err != nil {
		return 0, x.err
	}
	n, err := x.out.Read(p)
	if err == nil {
		return n, nil
	}
	if x.ring != nil && !errors.Is(err, io.EOF) {
		// The memory file failed, not the program, which may run on.
		x.Close()
		x.toolErr, x.err = err, err
		return n, err
	}
	// The output ended: the program exited or closed it. Its input is
	// settled (the feeding goroutine done) before the caller, told of the
	// end, looks at what was read from the source.
	<-x.fed
	werr := x.wait()
	x.waited = true
	switch {
	case x.feedErr != nil:
		// The source failed; whatever xz made of its bytes so far, the
		// image is not complete.
		x.err = fmt.Errorf("reading the xz stream: %w", x.feedErr)
	case werr != nil:
		x.err = x.failure(werr)
	case !errors.Is(err, io.EOF):
		x.err = err
	default:
		x.err = io.EOF
	}
	return n, x.err
}

// wait waits for the program, which has closed its output or exited.
func (x *xzReader) wait() error {
	if x.ring != nil {
		return x.ring.wait()
	}
	return x.cmd.Wait()
}

// failure is the error of an xz run that ended with werr.
func (x *xzReader) failure(werr error) error {
	var ee *exec.ExitError
	if errors.As(werr, &ee) && ee.ExitCode() < 0 {
		// Ended by a signal, which this process did not send.
		x.toolErr = fmt.Errorf("the xz program stopped: %w", werr)
		return x.toolErr
	}
	line, _, _ := strings.Cut(strings.TrimSpace(x.stderr.String()), "\n")
	// "/usr/bin/xz: (stdin): Compressed data is corrupt"
	msg := line
	if _, after, ok := strings.Cut(line, "(stdin): "); ok {
		msg = after
	}
	if msg == "" {
		return fmt.Errorf("xz: %w", werr)
	}
	return fmt.Errorf("xz: %s", strings.ToLower(msg[:1])+msg[1:])
}

// Close stops the program, if it still runs, and waits for it and for the
// feeding goroutine, which ends once its write finds the program gone.
func (x *xzReader) Close() error {
	x.closeOnce.Do(func() {
		if x.ring != nil {
			_ = x.cmd.Process.Kill() // a no-op once it has exited
			<-x.fed
			x.ring.close()
			return
		}
		if !x.waited {
			_ = x.cmd.Process.Kill()
			x.stdout.Close()
			<-x.fed
			_ = x.cmd.Wait()
			x.waited = true
		}
	})
	return nil
}
