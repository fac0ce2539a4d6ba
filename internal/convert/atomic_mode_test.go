package convert

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestOutputModeFollowsUmaskAndTheReplacedFile: an output file gets the
// mode os.Create would give under the user's umask, and replacing a file
// keeps that file's mode: a private file stays private.
func TestOutputModeFollowsUmaskAndTheReplacedFile(t *testing.T) {
	write := func(path string) os.FileMode {
		t.Helper()
		if err := WriteFileAtomic(path, false, func(o *OutputFile) error {
			_, err := o.Write([]byte("disk"))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Mode().Perm()
	}
	dir := t.TempDir()
	old := unix.Umask(0o077)
	t.Cleanup(func() { unix.Umask(old) })
	if got := write(filepath.Join(dir, "private.img")); got != 0o600 {
		t.Errorf("a new file under umask 077 has mode %o, want 600", got)
	}

	unix.Umask(0o022)
	if got := write(filepath.Join(dir, "shared.img")); got != 0o644 {
		t.Errorf("a new file under umask 022 has mode %o, want 644", got)
	}
	existing := filepath.Join(dir, "existing.img")
	if err := os.WriteFile(existing, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(existing, 0o600); err != nil {
		t.Fatal(err)
	}
	if got := write(existing); got != 0o600 {
		t.Errorf("replacing a 0600 file under umask 022 left mode %o, want 600", got)
	}
}
