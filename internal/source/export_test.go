package source

import (
	"io"
	"testing"
	"time"
)

// CacheHits reports how many digests the digest cache has served.
func CacheHits() int64 { return cacheHits.Load() }

// SetStdin makes the spec "-" read r until the test ends.
func SetStdin(t testing.TB, r io.Reader) {
	old := stdin
	stdin = r
	t.Cleanup(func() { stdin = old })
}

// SetResumeBackoff shortens the wait before resuming a download until the
// test ends.
func SetResumeBackoff(t testing.TB, d time.Duration) {
	old := resumeBackoff
	resumeBackoff = d
	t.Cleanup(func() { resumeBackoff = old })
}

// SetFreeSpace makes every Open until the test ends see avail bytes free
// in its temporary directory.
func SetFreeSpace(t testing.TB, avail int64) {
	old := freeSpaceHook
	freeSpaceHook = func(string) (int64, error) { return avail, nil }
	t.Cleanup(func() { freeSpaceHook = old })
}

// SetXZProgram makes xz sources decode with the program at path until the
// test ends; "" decodes them in Go.
func SetXZProgram(t testing.TB, path string) {
	old := xzProgram
	xzProgram = func() string { return path }
	t.Cleanup(func() { xzProgram = old })
}

// XZUtilsVersionOK exposes xzUtilsVersionOK.
var XZUtilsVersionOK = xzUtilsVersionOK

// SetFreeSpaceFunc makes every Open until the test ends ask free for the
// free space of its temporary directory.
func SetFreeSpaceFunc(t testing.TB, free func(dir string) (int64, error)) {
	old := freeSpaceHook
	freeSpaceHook = free
	t.Cleanup(func() { freeSpaceHook = old })
}

// FailXZLimit makes setting the xz program's limits fail with err until the
// test ends, as a user's own lower hard limit would for a non-root user.
func FailXZLimit(t testing.TB, err error) {
	old := limitXZ
	limitXZ = func(int, int64) error { return err }
	t.Cleanup(func() { limitXZ = old })
}

// UseXZPipe makes the xz program write to a pipe instead of a memory file
// until the test ends, as where no memory file can be made.
func UseXZPipe(t testing.TB) {
	old := xzRingOff
	xzRingOff = true
	t.Cleanup(func() { xzRingOff = old })
}
