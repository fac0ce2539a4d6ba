// Package bootcheck boots a disk under QEMU and reports whether its guest
// said it booted: a throwaway overlay (QEMU's snapshot=on, in a temporary
// directory), the firmware the inspection found (SeaBIOS or OVMF), a
// network that reaches nothing, an optional NoCloud seed, QEMU's seccomp sandbox, an optional
// unprivileged user, and bounds on CPU time (RLIMIT_CPU), guest memory,
// serial output and wall time. The guest has booted when a line of its
// serial console matches one of the signals (cloud-init's final message
// or a login prompt by default) before the deadline; the Report says when,
// with which firmware and accelerator, and the console's last lines.
//
// The disk is handed to QEMU as an open descriptor, so an unprivileged
// QEMU needs no access to the path it lies under.
package bootcheck
