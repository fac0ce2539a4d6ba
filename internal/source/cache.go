package source

import (
	"cmp"
	"encoding/json"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/imagepipe/imagepipe/internal/cachefile"
)

// The digest cache remembers the SHA-256 of local files, so importing the
// same unchanged file again skips reading it. docs/import.md says where it
// lives and why it is keyed so.

const (
	// cacheFileName is the cache's file name inside the cache directory.
	cacheFileName = "digests.json"
	// cacheMaxEntries bounds the cache; the newest entries are kept.
	cacheMaxEntries = 1000
	// cacheMaxFileSize bounds what is read of the file (about 200 bytes
	// per entry).
	cacheMaxFileSize = 1 << 20
	// cacheVersion is the format of digests.json; other versions are ignored.
	cacheVersion = 1
)

// cacheHits counts digests served from the cache, for tests.
var cacheHits atomic.Int64

// fileKey identifies one version of a local file. Any write changes the
// change time, which user space cannot set back.
type fileKey struct {
	Path    string `json:"path"`
	Dev     uint64 `json:"dev"`
	Ino     uint64 `json:"ino"`
	Size    int64  `json:"size"`
	MtimeNs int64  `json:"mtime_ns"`
	CtimeNs int64  `json:"ctime_ns"`
}

// cacheEntry is one remembered digest.
type cacheEntry struct {
	fileKey
	Digest string `json:"digest"`
	// StoredNs is when the entry was written, to keep the newest.
	StoredNs int64 `json:"stored_ns"`
}

// cacheFile is the content of digests.json.
type cacheFile struct {
	Version int          `json:"version"`
	Entries []cacheEntry `json:"entries"`
}

// keyOf returns the cache key of the open file path with info st.
func keyOf(path string, st fs.FileInfo) (fileKey, bool) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return fileKey{}, false
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return fileKey{}, false
	}
	return fileKey{
		Path:    abs,
		Dev:     uint64(sys.Dev),
		Ino:     sys.Ino,
		Size:    st.Size(),
		MtimeNs: sys.Mtim.Nano(),
		CtimeNs: sys.Ctim.Nano(),
	}, true
}

// digestCache reads and writes digests.json. Every failure is logged at
// debug level and otherwise ignored.
type digestCache struct {
	path string // "" when no cache directory is known
	log  *slog.Logger
}

func newDigestCache(log *slog.Logger) digestCache {
	dir := cachefile.Dir()
	if dir == "" {
		return digestCache{log: log}
	}
	return digestCache{path: filepath.Join(dir, cacheFileName), log: log}
}

// lookup returns the digest remembered for key.
func (c digestCache) lookup(key fileKey) (string, bool) {
	for _, e := range c.load().Entries {
		if e.fileKey == key && e.Digest != "" {
			cacheHits.Add(1)
			c.log.Debug("digest cache hit", "path", key.Path, "digest", e.Digest)
			return e.Digest, true
		}
	}
	return "", false
}

// store remembers digest for key, replacing any entry for the same path.
func (c digestCache) store(key fileKey, digest string) {
	if c.path == "" {
		return
	}
	cf := c.load()
	cf.Version = cacheVersion
	cf.Entries = slices.DeleteFunc(cf.Entries, func(e cacheEntry) bool { return e.Path == key.Path })
	cf.Entries = append(cf.Entries, cacheEntry{fileKey: key, Digest: digest, StoredNs: time.Now().UnixNano()})
	slices.SortStableFunc(cf.Entries, func(a, b cacheEntry) int { return cmp.Compare(b.StoredNs, a.StoredNs) })
	if len(cf.Entries) > cacheMaxEntries {
		cf.Entries = cf.Entries[:cacheMaxEntries]
	}
	if err := c.write(cf); err != nil {
		c.log.Debug("not writing the digest cache", "path", c.path, "error", err)
	}
}

// load reads the cache; a missing, unreadable or corrupt file is empty.
func (c digestCache) load() cacheFile {
	if c.path == "" {
		return cacheFile{}
	}
	// A digest from a cache others can write is a forgery waiting to
	// happen: it would let a different file pass --checksum.
	if err := cachefile.CheckFile(filepath.Dir(c.path), c.path); err != nil {
		c.log.Warn("not using the digest cache", "path", c.path, "error", err)
		return cacheFile{}
	}
	var cf cacheFile
	if err := cachefile.ReadJSON(c.path, cacheMaxFileSize, &cf); err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			c.log.Debug("ignoring an unreadable or corrupt digest cache", "path", c.path, "error", err)
		}
		return cacheFile{}
	}
	if cf.Version != cacheVersion {
		c.log.Debug("ignoring a digest cache of another version", "path", c.path, "version", cf.Version)
		return cacheFile{}
	}
	return cf
}

// write replaces the cache atomically: a temporary file in the same
// directory, renamed over the old one. Concurrent writers may lose each
// other's newest entry, which costs one re-read later, never a wrong digest.
func (c digestCache) write(cf cacheFile) error {
	data, err := json.Marshal(cf)
	if err != nil {
		return err
	}
	dir := filepath.Dir(c.path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return cachefile.WriteFile(c.path, data)
}
