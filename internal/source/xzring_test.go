package source

import (
	"bytes"
	"errors"
	"io"
	"os/exec"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/imagepipe/imagepipe/internal/need"
)

// onesXZ returns n bytes of 0x01, xz-compressed into a few KiB: data, not
// zeros, so every byte the program writes takes memory.
func onesXZ(t *testing.T, n int) []byte {
	t.Helper()
	out, err := exec.Command("sh", "-c", "head -c "+strconv.Itoa(n)+" /dev/zero | tr '\\0' '\\1' | xz -1 -c").Output()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// waitForStopped waits until the child process pid is stopped, and fails
// the test if it ends instead (once reaped, there is no child to wait for).
func waitForStopped(t *testing.T, pid int) {
	t.Helper()
	var info unix.Siginfo
	if err := unix.Waitid(unix.P_PID, pid, &info, unix.WSTOPPED|unix.WNOWAIT, nil); err != nil {
		t.Fatalf("the xz program ran to its end while its output went unread: %v", err)
	}
}

// TestXZRingPacesTheProgram: when the reader stops reading, the xz program
// is stopped with about xzRingMax bytes of output in memory, not the whole
// image; once the reader goes on, every byte arrives and the program ends.
// A reader closed while the program is stopped kills it.
func TestXZRingPacesTheProgram(t *testing.T) {
	program := need.Program(t, "xz")
	const size = 3 * xzRingMax
	stream := onesXZ(t, size)

	t.Run("read on", func(t *testing.T) {
		x := startXZ(program, bytes.NewReader(stream), nil)
		if x == nil || x.ring == nil {
			t.Fatal("the xz program did not start with a memory file")
		}
		defer x.Close()
		head := make([]byte, 4<<10)
		if _, err := io.ReadFull(x, head); err != nil {
			t.Fatal(err)
		}
		waitForStopped(t, x.cmd.Process.Pid)
		var st unix.Stat_t
		if err := unix.Fstat(x.ring.fd, &st); err != nil {
			t.Fatal(err)
		}
		// The pace looks every xzRingPoll; xz -1 output of one byte value
		// comes at a few hundred MB/s at most.
		if inMemory := st.Blocks * 512; inMemory > xzRingMax+32<<20 {
			t.Errorf("%d bytes in memory while the reader waited, want about %d", inMemory, xzRingMax)
		}
		if st.Size >= size {
			t.Errorf("the program wrote all %d bytes although nobody read them", st.Size)
		}
		n, ones := int64(len(head)), true
		buf := make([]byte, 1<<20)
		for {
			m, err := x.Read(buf)
			n += int64(m)
			ones = ones && bytes.Count(buf[:m], []byte{1}) == m
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		if n != size || !ones {
			t.Errorf("read %d bytes (all 0x01: %v), want %d", n, ones, size)
		}
	})

	t.Run("closed while stopped", func(t *testing.T) {
		x := startXZ(program, bytes.NewReader(stream), nil)
		if x == nil || x.ring == nil {
			t.Fatal("the xz program did not start with a memory file")
		}
		if _, err := io.ReadFull(x, make([]byte, 4<<10)); err != nil {
			t.Fatal(err)
		}
		pid := x.cmd.Process.Pid
		waitForStopped(t, pid)
		x.Close()
		if err := unix.Kill(pid, 0); !errors.Is(err, unix.ESRCH) {
			t.Errorf("the stopped program is still there after Close: %v", err)
		}
	})
}
