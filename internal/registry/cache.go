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
// private to the user, else "" (see cachefile.Usable).
func (c cacheDir) privateCachePath(path string) string {
	return cachefile.Usable(c.logger, c.dir, path)
}
