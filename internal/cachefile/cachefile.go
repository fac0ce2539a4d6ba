// Package cachefile keeps imagectl's cache files honest: it decides whether a
// file in the cache directory may be trusted, and replaces one atomically.
// The caches (the source digest cache, the build records, the
// upload state) let imagectl skip work on evidence it wrote itself; a cache
// someone else can write is evidence anyone can forge, so it is ignored.
package cachefile

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
)

// ErrUntrusted says why a cache file is not used.
var ErrUntrusted = errors.New("the cache is not private to this user")

// CheckPrivate returns nil when path belongs to the current user and
// neither its group nor others may write it (a missing path is fine). A
// symbolic link is refused, unless follow is set (for the cache directory
// itself), in which case its target is checked instead.
func CheckPrivate(path string, follow bool) error {
	stat := os.Lstat
	if follow {
		stat = os.Stat
	}
	st, err := stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if st.Mode()&fs.ModeSymlink != 0 {
		return fmt.Errorf("%w: %s is a symbolic link", ErrUntrusted, path)
	}
	if st.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("%w: others may write %s (mode %04o)", ErrUntrusted, path, st.Mode().Perm())
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && int(sys.Uid) != os.Getuid() {
		return fmt.Errorf("%w: %s belongs to user %d", ErrUntrusted, path, sys.Uid)
	}
	return nil
}

// CheckFile checks a cache file, the folder holding it and the cache
// directory dir (which may be a symbolic link to a private folder).
func CheckFile(dir, path string) error {
	for i, p := range []string{dir, filepath.Dir(path), path} {
		if err := CheckPrivate(p, i == 0); err != nil {
			return err
		}
	}
	return nil
}

// WriteFile replaces path with data atomically: data goes to a temporary
// file in the same folder (mode 0600), which is renamed over path once it
// is complete, so a reader sees the old content or the new one, never a
// part. Concurrent writers may lose each other's update, never mix them.
func WriteFile(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // a no-op once renamed
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// Dir is imagectl's cache directory: $IMAGEPIPE_CACHE, else imagepipe in
// the user's cache directory ($XDG_CACHE_HOME or ~/.cache); "" when
// neither is known.
func Dir() string {
	if d := os.Getenv("IMAGEPIPE_CACHE"); d != "" {
		return d
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "imagepipe")
	}
	return ""
}

// ReadJSON decodes the JSON file at path into v, reading at most max
// bytes: a larger file is an error, never a truncated document.
func ReadJSON(path string, max int64, v any) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return err
	}
	if int64(len(data)) > max {
		return fmt.Errorf("%s is larger than its limit of %d bytes", path, max)
	}
	return json.Unmarshal(data, v)
}

// Usable returns path when CheckFile(dir, path) passes, else logs why
// the cache is not used and returns "" ("" stays "").
func Usable(log *slog.Logger, dir, path string) string {
	if path == "" {
		return ""
	}
	if err := CheckFile(dir, path); err != nil {
		log.Warn("not using the cache", "path", path, "error", err)
		return ""
	}
	return path
}
