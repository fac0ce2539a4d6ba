package gate

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
)

// workDirPrefix starts the name of every gate's folder in its temp dir.
const workDirPrefix = "image-gate-"

// WorkDir is one gate process's folder in its temp dir, image-gate-*,
// holding its children's folders and its own spools. The gate holds an
// exclusive flock(2) on the folder for as long as it runs; the kernel
// drops the lock when the process ends, however it ends, so a folder
// whose lock nobody holds belongs to a gate that is gone. Several gates
// may share one temp dir: each removes only such folders, never a live
// gate's. Where flock is missing (not unix), no folder is ever taken for
// a dead one.
type WorkDir struct {
	// Path is the folder.
	Path string
	f    *os.File // holds the lock
}

// OpenWorkDir removes the folders that gates which are gone left in
// tempDir ("" means $TMPDIR), logging each, then creates and locks this
// gate's own. A folder that cannot be removed is logged and left.
func OpenWorkDir(tempDir string, log *slog.Logger) (*WorkDir, error) {
	if tempDir == "" {
		tempDir = os.TempDir()
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	removed, err := removeDeadWorkDirs(tempDir)
	for _, p := range removed {
		log.Info("removed the folder of a gate that is gone", "path", p)
	}
	if err != nil {
		log.Warn("removing the folders of gates that are gone", "error", err)
	}
	// Another gate starting at the same moment may take a folder made but
	// not yet locked for a dead gate's and remove it: then make another.
	for range 10 {
		path, err := os.MkdirTemp(tempDir, workDirPrefix+"*")
		if err != nil {
			return nil, fmt.Errorf("creating the gate's folder: %w", err)
		}
		f, err := lockWorkDir(path)
		switch {
		case errors.Is(err, errLockHeld) || errors.Is(err, os.ErrNotExist):
			continue
		case errors.Is(err, errors.ErrUnsupported):
			return &WorkDir{Path: path, f: f}, nil
		case err != nil:
			return nil, fmt.Errorf("locking the gate's folder: %w", err)
		}
		if stillAt(f, path) {
			return &WorkDir{Path: path, f: f}, nil
		}
		f.Close()
	}
	return nil, fmt.Errorf("creating the gate's folder in %s: another gate removed it each time", tempDir)
}

// Close removes the folder and releases its lock.
func (w *WorkDir) Close() error {
	err := os.RemoveAll(w.Path)
	if w.f != nil {
		if cerr := w.f.Close(); err == nil {
			err = cerr
		}
	}
	return err
}

// removeDeadWorkDirs removes every gate folder in tempDir whose lock
// nobody holds and returns their paths.
func removeDeadWorkDirs(tempDir string) ([]string, error) {
	entries, err := os.ReadDir(tempDir)
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", tempDir, err)
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), workDirPrefix) {
			continue // a symlink too: it is nobody's folder
		}
		path := filepath.Join(tempDir, e.Name())
		f, err := lockWorkDir(path)
		switch {
		case errors.Is(err, errLockHeld) || errors.Is(err, os.ErrNotExist) || errors.Is(err, errors.ErrUnsupported):
			continue
		case err != nil:
			errs = append(errs, fmt.Errorf("locking %s: %w", path, err))
			continue
		}
		// Another starting gate may have removed it while this one
		// waited for the lock; what is at path now is not what was locked.
		if stillAt(f, path) {
			if err := os.RemoveAll(path); err != nil {
				errs = append(errs, fmt.Errorf("removing %s: %w", path, err))
			} else {
				removed = append(removed, path)
			}
		}
		f.Close()
	}
	return removed, errors.Join(errs...)
}

// stillAt reports whether the open folder f is the one at path.
func stillAt(f *os.File, path string) bool {
	a, err := f.Stat()
	if err != nil {
		return false
	}
	b, err := os.Lstat(path)
	return err == nil && os.SameFile(a, b)
}

// errLockHeld says another process holds a folder's lock.
var errLockHeld = errors.New("the folder is locked by a running gate")
