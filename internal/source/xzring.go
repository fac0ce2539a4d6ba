package source

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// This file holds the memory file that the xz program decodes into when its
// output is read rather than spooled (startXZ): an anonymous file in memory
// (memfd), read just behind the program as it writes, with each range read
// freed again. Compared with a pipe, the program's writes cost a fraction of
// the time, and nothing is written to the temporary directory:
//   - xz writes runs of zeros to a regular file as holes (a seek, no write),
//     and those are most of a disk image;
//   - a pipe costs the program a copy and a wake-up of the reader for every
//     64 KiB to 1 MiB, which on a single-block file measured a sixth of its
//     decoding time.
//
// The bytes the program has written below the file's size are final: it
// writes front to back and never returns, and the kernel grows the size
// only after the bytes below it are copied.

// xzRingMax bounds the memory the file holds: when more than this many
// bytes of the program's output are in memory, not yet freed (the reader
// is slower than the program, e.g. while the caller writes a spool to a
// slow disk), the program is stopped (SIGSTOP) until the reader has caught
// up to half of it. Holes cost no memory and do not count. The memory is
// looked at every xzRingPoll, so it can pass the bound by what the program
// writes in that time.
const xzRingMax = 64 << 20

// xzRingPoll is how long the reader waits for the program when it has read
// all the program has written so far, and how often pace looks at the
// memory in use. The program writes a few hundred MB of data per second at
// most (zeros are holes), so one interval covers well under xzRingMax;
// waiting longer would cost more at the end, waiting less more wake-ups,
// both on a CPU the program could use.
const xzRingPoll = 10 * time.Millisecond

// xzRingFree is how many bytes are read between two frees: each takes the
// file's lock, which the program's writes need too.
const xzRingFree = 8 << 20

// xzRing is the memory file the running xz program writes its output to.
type xzRing struct {
	fd      int         // this process's own open file description of the file
	proc    *os.Process // the program
	off     int64       // the next byte to read
	size    int64       // the file's size when last looked at
	punched int64       // bytes below this offset have been freed
	// progress, when set, is called before each wait for the program, and
	// with exited true once it has exited successfully and all is read.
	progress func(exited bool)

	exited chan struct{} // closed when the program has exited
	paced  chan struct{} // closed when pace has returned
	werr   error         // the program's exit; read after exited is closed
}

// newXZRing makes the memory file and sets it as cmd's standard output.
// It returns the file for the caller to close once cmd has started, and
// the ring, which reads through a description of its own: the program's
// description has the program's offset, which reading must not move.
// Where anonymous memory files cannot be made (a kernel before 3.17, or a
// sandbox that forbids memfd_create) it returns nils and leaves cmd as it
// was, and the caller reads the program through a pipe.
func newXZRing(cmd *exec.Cmd) (*os.File, *xzRing) {
	wfd, err := unix.MemfdCreate("imagepipe-xz", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, nil
	}
	w := os.NewFile(uintptr(wfd), "xz output")
	rfd, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", wfd), unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		w.Close()
		return nil, nil
	}
	cmd.Stdout = w
	return w, &xzRing{fd: rfd, exited: make(chan struct{}), paced: make(chan struct{})}
}

// watch waits for the started program and records its exit (it is the
// only caller of cmd.Wait), and paces the program meanwhile.
func (g *xzRing) watch(cmd *exec.Cmd) {
	g.proc = cmd.Process
	go func() {
		g.werr = cmd.Wait()
		close(g.exited)
	}()
	go g.pace()
}

// pace stops the program while more than xzRingMax bytes of its output are
// in memory, and lets it go on once at most half of that are, until it
// exits.
func (g *xzRing) pace() {
	defer close(g.paced)
	tick := time.NewTicker(xzRingPoll)
	defer tick.Stop()
	paused := false
	for {
		select {
		case <-g.exited:
			return
		case <-tick.C:
		}
		var st unix.Stat_t
		if unix.Fstat(g.fd, &st) != nil {
			continue
		}
		switch inMemory := st.Blocks * 512; {
		case !paused && inMemory > xzRingMax:
			paused = g.proc.Signal(syscall.SIGSTOP) == nil
		case paused && inMemory <= xzRingMax/2:
			paused = g.proc.Signal(syscall.SIGCONT) != nil
		}
	}
}

// Read returns the program's output as it is written, holes as zeros, and
// io.EOF once the program has exited and all it wrote has been read; the
// caller then looks at wait for how it exited.
func (g *xzRing) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	var poll *time.Timer
	for {
		if g.off < g.size {
			n, err := g.readAt(p[:min(int64(len(p)), g.size-g.off)])
			if err != nil {
				return 0, fmt.Errorf("reading the xz program's output: %w", err)
			}
			g.off += int64(n)
			g.free(false)
			return n, nil
		}
		// All of the size last seen is read: look again. Whether the
		// program had exited is settled before the size is read, so a size
		// read after its exit is the final size.
		exited := isClosed(g.exited)
		var st unix.Stat_t
		if err := unix.Fstat(g.fd, &st); err != nil {
			return 0, fmt.Errorf("reading the xz program's output: %w", err)
		}
		if g.off < st.Size {
			g.size = st.Size
			continue
		}
		if exited {
			if g.progress != nil && g.werr == nil {
				g.progress(true)
			}
			return 0, io.EOF
		}
		g.free(true)
		if g.progress != nil {
			g.progress(false)
		}
		if poll == nil {
			poll = time.NewTimer(xzRingPoll)
			defer poll.Stop()
		} else {
			poll.Reset(xzRingPoll)
		}
		select {
		case <-g.exited:
		case <-poll.C:
		}
	}
}

// readAt reads p from the file at the next offset, below its size; a hole
// (a run of zeros the program skipped) is zeros without a read.
func (g *xzRing) readAt(p []byte) (int, error) {
	data, err := unix.Seek(g.fd, g.off, unix.SEEK_DATA)
	switch {
	case errors.Is(err, unix.ENXIO): // a hole up to the size
		data = g.off + int64(len(p))
	case err != nil:
		data = g.off
	}
	if hole := data - g.off; hole > 0 {
		n := int(min(hole, int64(len(p))))
		clear(p[:n])
		return n, nil
	}
	return unix.Pread(g.fd, p, g.off)
}

// free gives back the memory of the whole pages read so far, every
// xzRingFree bytes or, when all is read, at once.
func (g *xzRing) free(all bool) {
	end := g.off &^ (4<<10 - 1)
	if end <= g.punched || !all && end-g.punched < xzRingFree {
		return
	}
	// Memory files can always punch holes; were it to fail, the memory
	// would stay in use until close.
	if unix.Fallocate(g.fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, g.punched, end-g.punched) == nil {
		g.punched = end
	}
}

// wait waits for the program to exit and returns how it exited.
func (g *xzRing) wait() error {
	<-g.exited
	return g.werr
}

// close kills the program if it still runs (stopped or not), waits for it,
// and frees the file.
func (g *xzRing) close() {
	if !isClosed(g.exited) {
		_ = g.proc.Kill()
	}
	<-g.exited
	<-g.paced
	unix.Close(g.fd)
}

// closeUnstarted frees the file of a program that did not start.
func (g *xzRing) closeUnstarted() { unix.Close(g.fd) }

// isClosed reports whether c is closed, without waiting.
func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
