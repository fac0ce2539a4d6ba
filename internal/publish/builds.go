package publish

import (
	"cmp"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"time"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/imagepipe/imagepipe/internal/cachefile"
	"github.com/imagepipe/imagepipe/internal/imageref"
)

// The build record is this machine's evidence of what it pushed: for each
// build key, the registry, repository and manifest digest (with its config
// and layer digests) of every image it built or copied from one it built.
// A re-import skips work only when such a record exists and the registry
// still holds exactly that manifest and both its blobs (reuseBuild):
// nothing found in a registry alone is trusted, since anyone with push
// access can put any image under any tag, with any annotations. Losing the
// file only costs the optimisation.
//
// The file is trusted only when it and the cache directory belong to the
// user and nobody else may write them (like ssh's files); otherwise it is
// neither read nor written.

const (
	// buildsFileName is the record's file name in the cache directory.
	buildsFileName = "builds.json"
	// buildsVersion is the file's format; other versions are ignored.
	buildsVersion = 2
	// buildsMaxEntries bounds the record; the newest entries are kept.
	buildsMaxEntries = 1000
	// buildsMaxFileSize bounds what is read of the file (about 400 bytes
	// per entry).
	buildsMaxFileSize = 4 << 20
)

// buildKeyPattern is the form of AnnotationBuildKey imagepipe writes.
var buildKeyPattern = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// buildRecord is one image this machine pushed (or copied from one it
// pushed): where it is and what it is made of.
type buildRecord struct {
	Key        string `json:"key"`
	Registry   string `json:"registry"`
	Repository string `json:"repository"`
	Digest     string `json:"digest"` // the manifest's
	Config     string `json:"config"`
	Layer      string `json:"layer"`
	LayerSize  int64  `json:"layerSize"`
	StoredNs   int64  `json:"storedNs"`
}

// valid reports whether every field has the form imagepipe writes, so a
// damaged record is never acted on.
func (r buildRecord) valid() bool {
	if !buildKeyPattern.MatchString(r.Key) || imageref.CheckDigest(r.Config) != nil || imageref.CheckDigest(r.Layer) != nil || r.LayerSize <= 0 {
		return false
	}
	_, err := imageref.Parse(r.Registry+"/"+r.Repository+"@"+r.Digest, imageref.FormImage)
	return err == nil
}

type buildsFile struct {
	Version int           `json:"version"`
	Records []buildRecord `json:"records"`
}

// cacheDir is an Importer's cache directory, which holds its build
// record; "" disables it.
type cacheDir struct {
	dir    string
	logger *slog.Logger
}

func (c cacheDir) buildsPath() string {
	if c.dir == "" {
		return ""
	}
	return filepath.Join(c.dir, buildsFileName)
}

// privateCachePath returns path when it and the cache directory are
// private to the user, else "" (see cachefile.Usable).
func (c cacheDir) privateCachePath(path string) string {
	return cachefile.Usable(c.logger, c.dir, path)
}

func (c cacheDir) loadBuilds() []buildRecord {
	p := c.privateCachePath(c.buildsPath())
	if p == "" {
		return nil
	}
	var file buildsFile
	if err := cachefile.ReadJSON(p, buildsMaxFileSize, &file); err != nil || file.Version != buildsVersion {
		c.logger.Debug("ignoring an unreadable, corrupt or older build record", "path", p)
		return nil
	}
	return slices.DeleteFunc(file.Records, func(r buildRecord) bool { return !r.valid() })
}

// lookupBuilds returns the records of key on registry, the one in
// repository first, then the newest.
func (c cacheDir) lookupBuilds(key, registry, repository string) []buildRecord {
	var out []buildRecord
	for _, r := range c.loadBuilds() {
		if r.Key == key && r.Registry == registry {
			out = append(out, r)
		}
	}
	slices.SortStableFunc(out, func(a, b buildRecord) int {
		if (a.Repository == repository) != (b.Repository == repository) {
			if a.Repository == repository {
				return -1
			}
			return 1
		}
		return cmp.Compare(b.StoredNs, a.StoredNs)
	})
	return out
}

// lookupDigest returns a record of the image with manifest digest d, if
// this machine pushed it anywhere.
func (c cacheDir) lookupDigest(d string) (buildRecord, bool) {
	for _, r := range c.loadBuilds() {
		if r.Digest == d {
			return r, true
		}
	}
	return buildRecord{}, false
}

// rememberBuild records that r's image is in r's repository (replacing an
// older record of the same key there); errors are ignored.
func (c cacheDir) rememberBuild(r buildRecord) {
	p := c.buildsPath()
	if p == "" || !r.valid() {
		return
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil || c.privateCachePath(p) == "" {
		return
	}
	records := slices.DeleteFunc(c.loadBuilds(), func(o buildRecord) bool {
		return o.Key == r.Key && o.Registry == r.Registry && o.Repository == r.Repository
	})
	r.StoredNs = time.Now().UnixNano()
	records = append(records, r)
	if len(records) > buildsMaxEntries {
		slices.SortFunc(records, func(a, b buildRecord) int { return cmp.Compare(b.StoredNs, a.StoredNs) })
		records = records[:buildsMaxEntries]
	}
	c.saveBuilds(p, records)
}

// forgetBuild drops the record of key in registry/repository, once the
// registry no longer holds what it says.
func (c cacheDir) forgetBuild(r buildRecord) {
	p := c.privateCachePath(c.buildsPath())
	if p == "" {
		return
	}
	all := c.loadBuilds()
	records := slices.DeleteFunc(slices.Clone(all), func(o buildRecord) bool {
		return o.Key == r.Key && o.Registry == r.Registry && o.Repository == r.Repository && o.Digest == r.Digest
	})
	if len(records) == len(all) {
		return
	}
	c.saveBuilds(p, records)
}

// saveBuilds replaces the file at p with records, atomically; errors are
// ignored.
func (c cacheDir) saveBuilds(p string, records []buildRecord) {
	b, err := json.Marshal(buildsFile{Version: buildsVersion, Records: records})
	if err != nil {
		return
	}
	_ = cachefile.WriteFile(p, b)
}

// RecordCopy notes that the image of manifest digest d is now also at
// dst, when this machine built it: importing the same source into dst's
// repository then only tags.
func (im *Importer) RecordCopy(d string, dst name.Repository) {
	if rec, ok := im.builds().lookupDigest(d); ok {
		rec.Registry, rec.Repository = dst.RegistryStr(), dst.RepositoryStr()
		im.builds().rememberBuild(rec)
	}
}
