package main

import (
	"strings"
	"testing"
	"time"
)

// TestABootCheckThatCannotRunStopsTheGate: a gate told to boot what it
// verifies does not start without QEMU, or with root as QEMU's user,
// rather than failing every verification; flags out of range are named.
func TestABootCheckThatCannotRunStopsTheGate(t *testing.T) {
	valid := bootFlags{enabled: true, accel: "tcg", deadline: 5 * time.Minute, memoryMiB: 1024, qemu: "qemu-system-x86_64", maxOverlay: 1 << 30}
	if err := valid.validate(); err != nil {
		t.Fatalf("valid flags: %v", err)
	}
	for name, tc := range map[string]struct {
		mend func(*bootFlags)
		want string
	}{
		"no QEMU":          {func(b *bootFlags) { b.qemu = "/nonexistent/qemu-system-x86_64" }, "--boot-check needs QEMU"},
		"root as its user": {func(b *bootFlags) { b.user = "root" }, "--boot-user root is root"},
	} {
		b := valid
		tc.mend(&b)
		if err := b.prepare(t.Context(), t.TempDir()); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want %q", name, err, tc.want)
		}
	}
	for name, mend := range map[string]func(*bootFlags){
		"accelerator": func(b *bootFlags) { b.accel = "hvf" },
		"deadline":    func(b *bootFlags) { b.deadline = time.Second },
		"memory":      func(b *bootFlags) { b.memoryMiB = 64 },
		"overlay":     func(b *bootFlags) { b.maxOverlay = 1 << 20 },
	} {
		b := valid
		mend(&b)
		if err := b.validate(); err == nil {
			t.Errorf("%s out of range: accepted", name)
		}
	}
	off := bootFlags{qemu: "/nonexistent"}
	if err := off.prepare(t.Context(), t.TempDir()); err != nil || off.args() != nil {
		t.Errorf("the check off: %v, args %q; want nothing asked", err, off.args())
	}
}
