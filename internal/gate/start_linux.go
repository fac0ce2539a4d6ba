//go:build linux

package gate

import (
	"os/exec"
	"runtime"
	"sync"
	"syscall"
)

// startTied starts cmd so that the kernel kills it (SIGKILL) when the gate
// dies, however it dies: a child must not go on spooling for a gate that
// is gone.
//
// The kernel sends that signal when the thread that forked the child
// exits, not the process, and the Go runtime ends a thread whenever a
// goroutine locked to it (runtime.LockOSThread) returns without unlocking.
// A child forked from an ordinary goroutine could then be killed at
// random, when some later goroutine locked the same thread and returned.
// So every child is forked by one goroutine that locks its thread and
// never returns: that thread lives as long as the process.
func startTied(cmd *exec.Cmd) error {
	forkerOnce.Do(func() { go forker() })
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	req := forkRequest{cmd: cmd, started: make(chan error, 1)}
	forks <- req
	return <-req.started
}

type forkRequest struct {
	cmd     *exec.Cmd
	started chan error
}

var (
	forkerOnce sync.Once
	forks      = make(chan forkRequest)
)

// forker starts the commands it is sent, for the life of the process.
func forker() {
	runtime.LockOSThread() // never unlocked: see startTied
	for req := range forks {
		req.started <- req.cmd.Start()
	}
}
