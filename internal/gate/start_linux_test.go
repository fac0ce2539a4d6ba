package gate

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"testing"

	"github.com/imagepipe/imagepipe/pkg/api"
)

// TestChildSurvivesTheExitOfTheThreadThatAskedForIt: the kernel kills a
// child when the thread that forked it exits. A goroutine that locks its
// thread, starts a child and returns ends its thread; a child started
// there the plain way with a parent-death signal dies (the control, which
// shows that the thread did end), while a Child's survives and verifies.
//
// The runtime ends a thread that way except the process's main thread,
// which it parks instead: a goroutine that lands there holds it, and the
// next one runs on another thread; else the control would live and the
// test would hang.
var errMainThread = errors.New("the goroutine ran on the main thread")

func TestChildSurvivesTheExitOfTheThreadThatAskedForIt(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("PLAY_GATE_CHILD", "1")
	c := &Child{Path: exe, TempDir: t.TempDir()}
	control := exec.Command(exe)
	control.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	controlIn, err := control.StdinPipe() // kept open: the control waits for its subject
	if err != nil {
		t.Fatal(err)
	}
	defer controlIn.Close()

	type started struct {
		p   *childProcess
		err error
	}
	var s started
	release := make(chan struct{})
	defer close(release)
	ch := make(chan started)
	for tries := 0; ; tries++ {
		go func() {
			runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
			if syscall.Gettid() == syscall.Getpid() {
				// The main thread would be parked, not ended: hold it
				// for the test, so that the next try runs elsewhere.
				ch <- started{err: errMainThread}
				<-release
				runtime.UnlockOSThread()
				return
			}
			if err := control.Start(); err != nil {
				ch <- started{err: err}
				return
			}
			p, err := c.start()
			ch <- started{p, err}
		}()
		s = <-ch
		if s.err != errMainThread || tries == 2 {
			break
		}
	}
	if s.err != nil {
		t.Fatal(s.err)
	}
	err = control.Wait()
	if ws, ok := control.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("the control child ended with %v; want killed when its thread ended", err)
	}

	// The child waits for its subject: it answers, so it lives.
	subject, manifest := playedSubject(t)
	if err := writeTask(s.p.stdin, Task{Subject: subject, Manifest: manifest}); err != nil {
		t.Fatalf("the child started from the thread that ended does not read: %v", err)
	}
	s.p.stdin.Close()
	<-s.p.done
	var v api.Verdict
	if s.p.err != nil || json.Unmarshal(s.p.stdout.Bytes(), &v) != nil || v.Verdict != api.VerdictAccepted {
		t.Fatalf("the child started from the thread that ended: %v, %q", s.p.err, s.p.stdout.String())
	}
}
