package gate

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/imagepipe/imagepipe/internal/cachefile"
	"github.com/imagepipe/imagepipe/internal/containerdisk"
	"github.com/imagepipe/imagepipe/internal/convert"
	"github.com/imagepipe/imagepipe/internal/guest"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// DefaultMaxRecords bounds the records of each kind a Store keeps.
const DefaultMaxRecords = 100000

// Store is the gate's own record of its work, in a folder only the gate
// writes: the outcome of reading each layer, by what decides it (the
// layer's digest, the compression its media type names, the size limit,
// the engine version), the package list of its guest under the same key,
// and each verdict, by subject. What a manifest only
// claims of a layer (its size, its disk format) is compared with the
// record afterwards, never part of the key: a layer that many manifests,
// indexes, tags or tenants name, under any claims, is read once. A
// verdict a tenant hid or deleted in the registry is published again from
// here, never computed again. The parent and its verification children
// share it: records are JSON files replaced atomically, and a layer is
// read by one process at a time (LockLayer). Past MaxRecords records of a
// kind the oldest are removed: forgetting costs a read, never a wrong
// verdict.
type Store struct {
	Dir string
	// MaxRecords bounds each kind of record; 0 means DefaultMaxRecords.
	MaxRecords int

	writes atomic.Int64
}

// layerRecord is what reading one layer found: the layer is refused
// (Rejection), or its tar and disk are known, with the canonical layer
// that holds the verified disk.
type layerRecord struct {
	Key       string         `json:"key"`
	Rejection *api.Rejection `json:"rejection,omitempty"`
	// Size is the pushed layer's length in bytes, as read.
	Size int64 `json:"size,omitempty"`
	// TarDigest is the sha256 of the pushed layer's tar: the diff ID its
	// config must name.
	TarDigest   string         `json:"tarDigest,omitempty"`
	Format      convert.Format `json:"format,omitempty"`
	VirtualSize int64          `json:"virtualSize,omitempty"`
	// Canonical is the canonical layer, stored in Repository; DiffID and
	// DiskSize are its tar's.
	Canonical  ocispec.Descriptor `json:"canonical"`
	Repository string             `json:"repository,omitempty"`
	DiffID     string             `json:"diffID,omitempty"`
	DiskSize   int64              `json:"diskSize,omitempty"`
	// Guest is what the disk holds, when it was read (a disk verified in
	// the spool).
	Guest *api.GuestReport `json:"guest,omitempty"`
	// packages are the guest's installed packages, kept apart under the
	// same key (putPackages): the layer record, read on every
	// verification, stays small.
	packages []guest.Package
}

// layerKey names what decides a layer's outcome: its bytes (digest), the
// compression they are read with, the size limit and the engine. Media
// types naming one compression (OCI's and Docker's gzip) read alike.
func layerKey(layer digest.Digest, comp containerdisk.Compression, maxVirtualSize int64, engineVersion string) string {
	return strings.Join([]string{layer.String(), string(comp), fmt.Sprint(maxVirtualSize), engineVersion}, "\x00")
}

func (s *Store) path(kind, key string) string {
	sum := sha256.Sum256([]byte(key))
	return filepath.Join(s.Dir, kind, hex.EncodeToString(sum[:]))
}

// Layer returns the record of key, if the store has it.
func (s *Store) layer(key string) (*layerRecord, bool) {
	var rec layerRecord
	if !s.read("layers", key, &rec) || rec.Key != key {
		return nil, false
	}
	return &rec, true
}

func (s *Store) putLayer(rec *layerRecord) error { return s.write("layers", rec.Key, rec) }

// storedVerdict is a verdict as the store keeps it, with its subject.
type storedVerdict struct {
	Subject string       `json:"subject"`
	Verdict *api.Verdict `json:"verdict"`
}

// Verdict returns the last verdict the gate gave subject, if it kept it.
func (s *Store) Verdict(subject name.Digest) (*api.Verdict, bool) {
	var rec storedVerdict
	if s == nil || !s.read("verdicts", subject.String(), &rec) || rec.Subject != subject.String() || rec.Verdict == nil {
		return nil, false
	}
	return rec.Verdict, true
}

// PutVerdict keeps v, the verdict on subject.
func (s *Store) PutVerdict(subject name.Digest, v *api.Verdict) error {
	if s == nil {
		return nil
	}
	return s.write("verdicts", subject.String(), storedVerdict{Subject: subject.String(), Verdict: v})
}

// VerdictSubjects lists the subjects of the verdicts kept, as written
// ("REGISTRY/REPOSITORY@DIGEST").
func (s *Store) VerdictSubjects() []string {
	if s == nil {
		return nil
	}
	entries, err := os.ReadDir(filepath.Join(s.Dir, "verdicts"))
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		var rec storedVerdict
		if !strings.Contains(e.Name(), ".") && s.readFile(filepath.Join(s.Dir, "verdicts", e.Name()), &rec) && rec.Verdict != nil {
			out = append(out, rec.Subject)
		}
	}
	return out
}

// maxRecordSize bounds a record read back: a verdict lists at most
// maxIndexImages images and a few reasons.
const maxRecordSize = 1 << 20

func (s *Store) read(kind, key string, into any) bool {
	return s.readFile(s.path(kind, key), into)
}

func (s *Store) readFile(path string, into any) bool {
	return s.readFileLimit(path, maxRecordSize, into)
}

// readFileLimit reads the record at path, of at most limit bytes, into
// into.
func (s *Store) readFileLimit(path string, limit int64, into any) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || fi.Size() > limit {
		return false
	}
	b := make([]byte, fi.Size()+1)
	n, _ := f.ReadAt(b, 0)
	return int64(n) == fi.Size() && json.Unmarshal(b[:n], into) == nil
}

func (s *Store) write(kind, key string, rec any) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	dir := filepath.Join(s.Dir, kind)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating the gate's store: %w", err)
	}
	if err := cachefile.WriteFile(s.path(kind, key), b); err != nil {
		return fmt.Errorf("writing the gate's store: %w", err)
	}
	if s.writes.Add(1)%pruneEvery == 0 {
		s.prune(kind)
	}
	return nil
}

// pruneEvery is how many writes of a process pass between two prunings.
const pruneEvery = 256

// Prune removes the oldest records of each kind beyond MaxRecords.
func (s *Store) Prune() {
	for _, kind := range []string{"layers", "packages", "verdicts"} {
		s.prune(kind)
	}
}

func (s *Store) prune(kind string) {
	limit := s.MaxRecords
	if limit <= 0 {
		limit = DefaultMaxRecords
	}
	dir := filepath.Join(s.Dir, kind)
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) <= limit {
		return
	}
	type aged struct {
		name string
		mod  time.Time
	}
	var records []aged
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".lock") {
			continue
		}
		if info, err := e.Info(); err == nil {
			records = append(records, aged{e.Name(), info.ModTime()})
		}
	}
	slices.SortFunc(records, func(a, b aged) int { return a.mod.Compare(b.mod) })
	for _, r := range records[:max(0, len(records)-limit)] {
		os.Remove(filepath.Join(dir, r.name))
		os.Remove(filepath.Join(dir, r.name+".lock"))
	}
}

// lockPoll is how often a process waiting for another's read of a layer
// looks whether it is done.
const lockPoll = 100 * time.Millisecond

// lockLayer waits until no other process reads the layer of key, and
// returns the function that lets the next one in. The lock is the
// kernel's (flock), so a process that dies releases it.
func (s *Store) lockLayer(ctx context.Context, key string) (func(), error) {
	dir := filepath.Join(s.Dir, "layers")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating the gate's store: %w", err)
	}
	f, err := os.OpenFile(s.path("layers", key)+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("locking a layer in the gate's store: %w", err)
	}
	t := time.NewTicker(lockPoll)
	defer t.Stop()
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("locking a layer in the gate's store: %w", err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, context.Cause(ctx)
		case <-t.C:
		}
	}
}
