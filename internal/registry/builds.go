package registry

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// The build cache remembers where each build key was last pushed, so that
// importing the same disk into another repository of the same registry
// mounts the existing blobs instead of uploading them again. Losing it only
// costs that optimisation.

// buildsMaxEntries bounds the cache; the newest entries are kept.
const buildsMaxEntries = 1000

// buildRecord is where one build key's image lives.
type buildRecord struct {
	Registry   string `json:"registry"`
	Repository string `json:"repository"`
	Digest     string `json:"digest"`
	StoredNs   int64  `json:"storedNs"`
}

func (c *Client) buildsPath() string {
	if c.opts.cacheDir == "" {
		return ""
	}
	return filepath.Join(c.opts.cacheDir, "builds.json")
}

func (c *Client) loadBuilds() map[string]buildRecord {
	records := map[string]buildRecord{}
	if p := c.buildsPath(); p != "" {
		if b, err := os.ReadFile(p); err == nil {
			if json.Unmarshal(b, &records) != nil {
				c.opts.logger.Debug("ignoring a corrupt build cache", "path", p)
				return map[string]buildRecord{}
			}
		}
	}
	return records
}

// lookupBuild returns where key was last pushed.
func (c *Client) lookupBuild(key string) (buildRecord, bool) {
	r, ok := c.loadBuilds()[key]
	return r, ok
}

// rememberBuild records where key now lives; errors are ignored.
func (c *Client) rememberBuild(key string, r buildRecord) {
	p := c.buildsPath()
	if p == "" {
		return
	}
	records := c.loadBuilds()
	r.StoredNs = time.Now().UnixNano()
	records[key] = r
	if len(records) > buildsMaxEntries {
		keys := slices.SortedFunc(maps.Keys(records), func(a, b string) int {
			return int(records[b].StoredNs - records[a].StoredNs)
		})
		for _, k := range keys[buildsMaxEntries:] {
			delete(records, k)
		}
	}
	b, err := json.Marshal(records)
	if err != nil || os.MkdirAll(filepath.Dir(p), 0o700) != nil {
		return
	}
	tmp := p + ".tmp"
	if os.WriteFile(tmp, b, 0o600) == nil {
		os.Rename(tmp, p)
	}
}
