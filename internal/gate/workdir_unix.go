//go:build unix

package gate

import (
	"errors"
	"os"
	"syscall"
)

// lockWorkDir opens the folder at path, not following a symlink, and
// takes its exclusive lock without waiting: errLockHeld when a live
// process holds it.
func lockWorkDir(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, errLockHeld
		}
		return nil, err
	}
	return f, nil
}
