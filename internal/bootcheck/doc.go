// Package bootcheck boots a disk under QEMU and reports whether its guest
// said it booted: a throwaway overlay (QEMU's snapshot=on, in a temporary
// directory), the firmware the inspection found (SeaBIOS or OVMF), a NIC
// that reaches nothing, an optional NoCloud seed (WriteSeed writes one)
// and guest agent port, QEMU's seccomp sandbox, an optional unprivileged
// user, and bounds on CPU time (RLIMIT_CPU), overlay size (RLIMIT_FSIZE),
// guest memory, serial output and wall time. The guest has booted when a
// line of its serial console matches one of the signals (cloud-init's
// final message or a login prompt by default), or its agent answers
// guest-sync, before the deadline; the Report says when, with which
// firmware and accelerator, the console's last lines and QEMU's peak
// memory. Accelerator finds whether KVM boots guests here, with a probe
// disk WriteProbe writes.
//
// The disk, seed and firmware are handed to QEMU as open descriptors, so
// an unprivileged QEMU needs no access to the paths they lie under. What a
// guest prints is its own word: a hostile guest can claim to boot.
package bootcheck
