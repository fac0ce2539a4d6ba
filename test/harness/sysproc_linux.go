package harness

import "syscall"

// sysProcAttr has the kernel kill a component when the test binary dies without running its
// cleanups (a test timeout's panic, a SIGKILL), so no registry or MinIO outlives it.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
