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

// This file holds the xz program's second use: decoding through a pipe for
// Options.StreamRaw (imagectl inspect), which must write nothing to the
// temporary directory, so that a decompression bomb is judged without the
// disk it would fill, and wherever spoolXZ cannot limit the program. It
// costs more time than spoolXZ, since the program writes every decompressed
// byte into the pipe.

// startXZ decodes the xz stream compressed with the program at path
// through a pipe, which is several times faster than the pure-Go decoder
// (about a sixth slower than `xz -dc > /dev/null` on a single-block file,
// and faster on multi-block files, which it decodes with a thread per
// core). It returns nil, having read nothing, when the program does not
// start, and the caller decodes the stream itself.
//
// The compressed bytes are fed to the program's standard input from a
// goroutine of its own; the decompressed bytes are read from its standard
// output. The bounds on untrusted input stay those of the caller, which
// counts and caps the decompressed bytes as it reads them; the program's
// memory is bounded by the stream's dictionary size (64 MiB for xz -9, at
// most 1.5 GiB for a hostile stream, as with the Go decoder), and its
// multi-threaded decoder falls back to one thread rather than pass xz's
// default memory limit for threads. XZ_DEFAULTS and XZ_OPT are cleared, so
// the user's settings for compression cannot change decoding.
func startXZ(path string, compressed io.Reader) *xzReader {
	cmd := exec.Command(path, "--decompress", "--stdout", "--threads=0")
	cmd.Env = xzEnv(os.Environ())
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		stdin.Close()
		return nil
	}
	// Larger pipes than the default 64 KiB: fewer switches between xz
	// and this process, which matter at a GiB per second of zeros.
	growPipe(stdin)
	growPipe(stdout)
	x := &xzReader{cmd: cmd, stdout: stdout, fed: make(chan struct{})}
	cmd.Stderr = &x.stderr
	if err := cmd.Start(); err != nil {
		stdin.Close()
		stdout.Close()
		return nil
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
	stdout io.ReadCloser
	stderr cappedBuffer
	fed    chan struct{} // closed when the feeding goroutine is done
	// feedErr is the error reading the compressed stream, if any; read it
	// after fed is closed.
	feedErr error

	err       error // the sticky result of Read once the output ended
	closeOnce sync.Once
	waited    bool
	// toolErr is set when the program failed for a reason of its own (it
	// was killed, e.g. by the OOM killer), not because of the stream: no
	// verdict on the image. Read it after Read returned an error.
	toolErr error
}

func (x *xzReader) Read(p []byte) (int, error) {
	if x.err != nil {
		return 0, x.err
	}
	n, err := x.stdout.Read(p)
	if err == nil {
		return n, nil
	}
	// The output ended: the program exited or closed it. Its input is
	// settled (the feeding goroutine done) before the caller, told of the
	// end, looks at what was read from the source.
	<-x.fed
	werr := x.cmd.Wait()
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
