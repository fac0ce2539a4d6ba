package nodestandin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// sandbox is one run of a container: the host binary its image names, run in private mount and
// PID namespaces, chrooted into a tmpfs root holding read-only binds of the host's /usr, /etc and
// /sys, a fresh /proc, a /dev with only null, zero, full, random, urandom and the pod's block
// devices, a private /tmp, and the pod's volumes (claims mounted from their loop devices, config
// maps and secrets written as files). It runs as the container's runAsUser, with the pod's
// fsGroup applied to its volumes as kubelet does, and shares the host's network namespace, so
// that it reaches the test's registry on 127.0.0.1.
type sandbox struct {
	// root is an empty host directory; the sandbox mounts a tmpfs on it in its own namespace,
	// so nothing the container writes outside its volumes reaches the host.
	root string
	// entrypoint is the host binary run as the container's entrypoint, with args.
	entrypoint string
	args       []string
	// env is the container's environment, exactly; nothing of the test's leaks in.
	env []string
	// workingDir is the container's working directory, "/" when empty.
	workingDir string
	// uid and gid are the user and group the container runs as; fsGroup, when set, is added to
	// its groups and applied to its filesystem volumes.
	uid, gid int64
	fsGroup  *int64
	// mounts map the pod's volumes into the container: host directories and files, claims'
	// ext4 filesystems (from their loop devices) and claims' block devices.
	mounts []mount
	// terminationLog is the host file bound onto terminationPath in the container.
	terminationLog, terminationPath string
	// log receives the container's stdout and stderr.
	log io.Writer
}

// mount maps a host path into the container, as kind says.
type mount struct {
	kind            mountKind
	host, container string
	readOnly        bool
}

// mountKind is how a mount's host path becomes part of the container.
type mountKind int

const (
	// bindMount binds a host directory or file.
	bindMount mountKind = iota
	// ext4Mount mounts the ext4 filesystem on a loop device, with the pod's fsGroup applied.
	ext4Mount
	// blockDevice makes a device node of a loop device, owned by the container's user.
	blockDevice
)

// stopGrace is how long a container has after SIGTERM before SIGKILL, when its pod is deleted.
const stopGrace = 5 * time.Second

// run runs the container until it exits or ctx ends, and returns its exit code the way a
// container runtime reports it: the process's status, or 128 plus the signal that ended it.
func (s *sandbox) run(ctx context.Context) (int, error) {
	script, err := s.script()
	if err != nil {
		return 0, err
	}
	// unshare forks the script as PID 1 of a new PID namespace; --kill-child ends that
	// namespace, the container with it, when unshare itself is ended.
	cmd := exec.CommandContext(ctx, "unshare", "--mount", "--pid", "--fork", "--propagation", "private", "--kill-child",
		"--", "/bin/sh", "-c", script, "sandbox")
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Stdout, cmd.Stderr = s.log, s.log
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = stopGrace
	err = cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, nil
	case errors.As(err, &exit):
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal()), nil
		}
		return exit.ExitCode(), nil
	default:
		return 0, fmt.Errorf("running the sandbox: %w", err)
	}
}

// script is the shell program that builds the container's root inside the new namespaces and
// then execs the entrypoint there. Every path and value in it is single-quoted.
func (s *sandbox) script() (string, error) {
	var b strings.Builder
	line := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	r := func(p string) string { return quote(filepath.Join(s.root, p)) }

	line("set -eu")
	line("mount -t tmpfs -o mode=0755 nodestandin-root %s", quote(s.root))
	line("mkdir %s %s %s %s %s %s", r("usr"), r("etc"), r("sys"), r("proc"), r("dev"), r("tmp"))
	for _, l := range []string{"bin", "sbin", "lib", "lib64"} {
		line("ln -s %s %s", quote("usr/"+l), r(l))
	}
	for _, d := range []string{"usr", "etc", "sys"} {
		line("mount --rbind %s %s && mount -o remount,bind,ro %s", quote("/"+d), r(d), r(d))
	}
	line("mount -t proc proc %s", r("proc"))
	line("mount -t tmpfs -o mode=0755,nosuid nodestandin-dev %s", r("dev"))
	for _, d := range []struct {
		name         string
		major, minor int
	}{{"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7}, {"random", 1, 8}, {"urandom", 1, 9}} {
		line("mknod -m 0666 %s c %d %d", r("dev/"+d.name), d.major, d.minor)
	}
	line("ln -s /proc/self/fd %s", r("dev/fd"))
	line("mount -t tmpfs -o mode=1777,nosuid,nodev nodestandin-tmp %s", r("tmp"))

	// Volumes, parents before children.
	mounts := append(slices.Clone(s.mounts),
		mount{kind: bindMount, host: s.terminationLog, container: s.terminationPath},
		mount{kind: bindMount, host: s.entrypoint, container: "/.nodestandin/entrypoint", readOnly: true})
	slices.SortStableFunc(mounts, func(a, b mount) int { return strings.Count(a.container, "/") - strings.Count(b.container, "/") })
	for _, m := range mounts {
		if !filepath.IsAbs(m.container) || strings.Contains(m.container, "/../") || strings.HasSuffix(m.container, "/..") {
			return "", fmt.Errorf("container path %q is not a clean absolute path", m.container)
		}
		target := r(m.container)
		switch m.kind {
		case bindMount:
			fi, err := os.Stat(m.host)
			if err != nil {
				return "", err
			}
			if fi.IsDir() {
				line("mkdir -p %s", target)
			} else {
				line("mkdir -p %s && touch %s", quote(filepath.Dir(filepath.Join(s.root, m.container))), target)
			}
			line("mount --bind %s %s", quote(m.host), target)
			if m.readOnly {
				line("mount -o remount,bind,ro %s", target)
			}
		case ext4Mount:
			line("mkdir -p %s && mount -t ext4 %s %s", target, quote(m.host), target)
			if s.fsGroup != nil {
				// What kubelet does with a pod's fsGroup on a volume that supports ownership.
				line("chgrp -R %d %s && chmod -R g+rwX %s && chmod g+s %s", *s.fsGroup, target, target, target)
			}
		case blockDevice:
			var st unix.Stat_t
			if err := unix.Stat(m.host, &st); err != nil {
				return "", fmt.Errorf("reading block device %s: %w", m.host, err)
			}
			line("mkdir -p %s", quote(filepath.Dir(filepath.Join(s.root, m.container))))
			line("mknod -m 0660 %s b %d %d && chown %d:%d %s", target, unix.Major(st.Rdev), unix.Minor(st.Rdev), s.uid, s.gid, target)
		}
	}

	groups := ""
	if s.fsGroup != nil {
		groups = " --groups=" + strconv.FormatInt(*s.fsGroup, 10)
	}
	dir := s.workingDir
	if dir == "" {
		dir = "/"
	}
	exec := []string{"exec", "chroot", fmt.Sprintf("--userspec=%d:%d%s", s.uid, s.gid, groups), quote(s.root),
		"/usr/bin/env", "-i", "-C", quote(dir)}
	for _, kv := range s.env {
		exec = append(exec, quote(kv))
	}
	exec = append(exec, "/.nodestandin/entrypoint")
	for _, a := range s.args {
		exec = append(exec, quote(a))
	}
	line("%s", strings.Join(exec, " "))
	return b.String(), nil
}

// quote single-quotes s for the shell.
func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
