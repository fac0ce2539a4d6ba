//go:build !linux

package harness

import "syscall"

// sysProcAttr is nil where the kernel cannot tie a child's life to its parent's.
func sysProcAttr() *syscall.SysProcAttr { return nil }
