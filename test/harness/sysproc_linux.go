package harness

import "syscall"

// sysProcAttr has the kernel kill a component when the test binary dies without running its
// cleanups (a test timeout's panic, a SIGKILL), so no registry or MinIO outlives it. Each
// component also gets a process group of its own, so that a Ctrl-C on the terminal reaches only
// the test binary (and the commands it runs in the foreground), which then stops the components
// in order through its cleanups, instead of every server dying at once.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
}
