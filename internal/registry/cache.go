package registry

import (
	"log/slog"

	"github.com/imagepipe/imagepipe/internal/cachefile"
)

// cacheDir is a Client's cache directory, which holds the state of its
// uploads (upload.go); "" disables it.
type cacheDir struct {
	dir    string
	logger *slog.Logger
}

// privateCachePath returns path when it and the cache directory are
// private to the user, else logs why not and returns "".
func (c cacheDir) privateCachePath(path string) string {
	if path == "" {
		return ""
	}
	if err := cachefile.CheckFile(c.dir, path); err != nil {
		c.logger.Warn("not using the cache", "path", path, "error", err)
		return ""
	}
	return path
}
