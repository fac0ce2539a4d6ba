//go:build !linux

package gate

import "os/exec"

// startTied starts cmd. Only Linux can have the kernel kill a child when
// its parent dies; elsewhere a child outlives a gate that is killed.
func startTied(cmd *exec.Cmd) error { return cmd.Start() }
