package gate

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/imagepipe/imagepipe/internal/containerdisk"
	"github.com/imagepipe/imagepipe/internal/convert"
	"github.com/imagepipe/imagepipe/internal/guest"
	"github.com/imagepipe/imagepipe/internal/ocidoc"
	"github.com/imagepipe/imagepipe/internal/publish"
	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/internal/reject"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// Defaults of the verifier's limits.
const (
	// DefaultMaxVirtualSize is the largest guest disk accepted, as
	// imagectl's default.
	DefaultMaxVirtualSize = 2 << 40
	// maxIndexImages bounds the images of one index the gate verifies.
	maxIndexImages = 8
)

// Registry is what the verifier needs of a registry; *registry.Client
// implements it.
type Registry interface {
	FetchManifest(ctx context.Context, ref name.Reference) (*registry.RawManifest, error)
	OpenBlob(ctx context.Context, repo name.Repository, digest string) (io.ReadCloser, error)
	publish.Registry
}

var _ Registry = (*registry.Client)(nil)

// Verifier reads a pushed image in full and publishes its canonical form.
type Verifier struct {
	Registry Registry
	// TempDir holds the disks being verified (sparse files, removed when
	// done); "" means the system's.
	TempDir string
	// MaxVirtualSize bounds the guest disk; 0 means DefaultMaxVirtualSize.
	MaxVirtualSize int64
	// Engine and Version name the verifier in verdicts.
	Engine, Version string
	// Logger receives progress; nil discards.
	Logger *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// MaxSpool bounds the data one verification spools, in bytes (holes
	// not counted); past it the image is refused (verification-limit). 0
	// means no bound.
	MaxSpool int64
	// spent counts what Verify decompressed and spooled (Spent).
	decompressed, spooled atomic.Int64
	// Store, when set, keeps each layer's outcome, so that a layer is read
	// once however many images name it; nil reads every layer named.
	Store *Store
	// Inspector, when set, reads each verified disk's guest in a process
	// of its own; nil reads it in this one.
	Inspector *Inspector
	// BootCheck, when set, boots each disk whose guest was read.
	BootCheck *BootCheck
}

// Spent is what the verifications of v decompressed and spooled so far;
// the CPU time is its process's.
func (v *Verifier) Spent() Cost {
	return Cost{Decompressed: v.decompressed.Load(), Spooled: v.spooled.Load()}
}

// maxDiskSize bounds the disk/disk.img a layer may declare: a qcow2 file
// of the largest virtual size needs at most 1/64 more for its tables
// (the spool's bound in internal/source), plus 64 MiB.
func (v *Verifier) maxDiskSize() int64 {
	vs := v.maxVirtualSize()
	return vs + vs/64 + 64<<20
}

// ErrLarge is matched by the error of a verification started with a
// limit on what the image declares (WithMaxDeclared) when the image
// declares more: a layer, a disk/disk.img or a qcow2 virtual size over the
// limit. It stops before any real work; it is neither a verdict nor a
// failure, and the work is put back to run without the limit.
var ErrLarge = errors.New("the image declares more than the reserve takes")

type maxDeclaredKey struct{}

// WithMaxDeclared is ctx for a verification that stops with ErrLarge on
// an image that declares more than limit bytes (0: no limit): what a
// reserve slot's verification may cost.
func WithMaxDeclared(ctx context.Context, limit int64) context.Context {
	return context.WithValue(ctx, maxDeclaredKey{}, limit)
}

// maxDeclared is the limit WithMaxDeclared set on ctx; 0 means none.
func maxDeclared(ctx context.Context) int64 {
	n, _ := ctx.Value(maxDeclaredKey{}).(int64)
	return n
}

// checkDeclared is ErrLarge when size, which the image declares of what
// (its layer, its disk, its disk's virtual size), is over the limit of
// ctx. What a verification costs is bounded by these three, which it
// learns before any real work: checkDeclared is called as each is known.
func checkDeclared(ctx context.Context, what string, size int64) error {
	if limit := maxDeclared(ctx); limit > 0 && size > limit {
		return fmt.Errorf("%s declares %d bytes, over the limit of %d of a reserve slot: %w", what, size, limit, ErrLarge)
	}
	return nil
}

// declaredVirtualSize passes writes to w and stops with ErrLarge once the
// first bytes are a qcow2 header whose virtual size is over the limit of
// ctx.
type declaredVirtualSize struct {
	ctx  context.Context
	w    io.Writer
	head []byte
	err  error
}

func (d *declaredVirtualSize) Write(p []byte) (int, error) {
	if d.err != nil {
		return 0, d.err
	}
	if len(d.head) < 32 {
		d.head = append(d.head, p[:min(len(p), 32-len(d.head))]...)
		if len(d.head) == 32 && string(d.head[:4]) == "QFI\xfb" {
			vsize := binary.BigEndian.Uint64(d.head[24:])
			if d.err = checkDeclared(d.ctx, "the qcow2 header", int64(min(vsize, 1<<62))); d.err != nil {
				return 0, d.err
			}
		}
	}
	return d.w.Write(p)
}

func (v *Verifier) maxVirtualSize() int64 {
	if v.MaxVirtualSize > 0 {
		return v.MaxVirtualSize
	}
	return DefaultMaxVirtualSize
}

func (v *Verifier) logger() *slog.Logger {
	if v.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return v.Logger
}

// Verify reads subject (an image or an index) in full and returns the
// verdict: accepted with the canonical image of each platform, which it
// has pushed into subject's repository by digest, or rejected with the
// reasons. An error means no verdict (the registry failed, the context
// ended): nothing about the image is known.
func (v *Verifier) Verify(ctx context.Context, subject name.Digest) (*api.Verdict, error) {
	raw, err := v.Registry.FetchManifest(ctx, subject)
	if err != nil {
		return nil, err
	}
	return v.VerifyManifest(ctx, subject, raw)
}

// VerifyManifest is Verify for a subject whose manifest the caller
// fetched already (registry.Client.FetchManifest), for the verdict that
// names it: raw is read instead of being fetched again. Its bytes must be
// the subject's (their digest is compared); anything else is an error,
// not a verdict.
func (v *Verifier) VerifyManifest(ctx context.Context, subject name.Digest, raw *registry.RawManifest) (*api.Verdict, error) {
	if raw == nil || len(raw.Bytes) > registry.MaxIndexSize || digest.FromBytes(raw.Bytes).String() != subject.DigestStr() {
		return nil, fmt.Errorf("the manifest given for %s is not the subject's", subject)
	}
	images, err := v.verifySubject(ctx, subject, raw)
	if re := reject.As(err); re != nil {
		return v.refusal(subject, api.Rejection{Code: string(re.Reason), Message: re.Detail}), nil
	}
	if err != nil {
		return nil, err
	}
	verdict := v.verdict(subject)
	verdict.Verdict, verdict.Images = api.VerdictAccepted, images
	return verdict, nil
}

// refusal is the verdict rejecting subject for reason.
func (v *Verifier) refusal(subject name.Digest, reason api.Rejection) *api.Verdict {
	verdict := v.verdict(subject)
	verdict.Verdict, verdict.Reasons = api.VerdictRejected, []api.Rejection{reason}
	return verdict
}

// verdict is a verdict on subject given now, without an answer yet.
func (v *Verifier) verdict(subject name.Digest) *api.Verdict {
	now := time.Now
	if v.Now != nil {
		now = v.Now
	}
	return &api.Verdict{
		Repository: subject.RepositoryStr(), Subject: subject.DigestStr(),
		Engine: v.Engine, EngineVersion: v.Version,
		VerifiedAt: now().UTC().Format(api.VerdictTimeFormat),
	}
}

// verifySubject verifies the image subject names, or each image of the
// index it names; raw is subject's manifest.
func (v *Verifier) verifySubject(ctx context.Context, subject name.Digest, raw *registry.RawManifest) ([]api.VerifiedImage, error) {
	doc, err := ocidoc.ParseDocument(string(raw.MediaType), raw.Bytes)
	if err != nil {
		return nil, err
	}
	if !doc.IsIndex() {
		img, err := v.verifyImage(ctx, subject.Context(), raw, doc, "")
		if err != nil {
			return nil, err
		}
		return []api.VerifiedImage{*img}, nil
	}
	if len(doc.Manifests) == 0 || len(doc.Manifests) > maxIndexImages {
		return nil, reject.New(reject.ManifestShape, "the index lists %d images; a containerDisk index lists 1 to %d", len(doc.Manifests), maxIndexImages)
	}
	var images []api.VerifiedImage
	seen := map[string]bool{}
	for _, entry := range doc.Manifests {
		p := entry.Platform
		if p == nil || !ocidoc.LinuxPlatform(*p) {
			return nil, reject.New(reject.ManifestShape, "the index entry %s names no linux platform", entry.Digest)
		}
		platform := ocidoc.PlatformString(*p)
		if seen[platform] {
			return nil, reject.New(reject.ManifestShape, "the index lists %s twice; readers disagree on which one counts", platform)
		}
		seen[platform] = true
		ref := subject.Context().Digest(entry.Digest.String())
		raw, err := v.Registry.FetchManifest(ctx, ref)
		if err != nil {
			return nil, err
		}
		if string(raw.MediaType) != entry.MediaType {
			return nil, reject.New(reject.ManifestShape, "the index says %s is a %q but the registry serves a %q", entry.Digest, entry.MediaType, raw.MediaType)
		}
		doc, err := ocidoc.ParseDocument(string(raw.MediaType), raw.Bytes)
		if err != nil {
			return nil, err
		}
		if doc.IsIndex() {
			return nil, reject.New(reject.ManifestShape, "the index entry %s is itself an index", entry.Digest)
		}
		img, err := v.verifyImage(ctx, subject.Context(), raw, doc, platform)
		if err != nil {
			return nil, err
		}
		images = append(images, *img)
	}
	return images, nil
}

// verifyImage verifies one image manifest in full; platform, when set, is
// what its index entry says the image is for.
func (v *Verifier) verifyImage(ctx context.Context, repo name.Repository, raw *registry.RawManifest, doc *ocidoc.Document, platform string) (*api.VerifiedImage, error) {
	if err := containerdisk.CheckLayerCount(len(doc.Layers)); err != nil {
		return nil, err
	}
	cfgBytes, err := v.readBlob(ctx, repo, doc.Config.Descriptor, ocidoc.MaxConfigSize)
	if err != nil {
		return nil, err
	}
	cfg, err := ocidoc.ParseConfig(cfgBytes, doc.Config.MediaType)
	if err != nil {
		return nil, err
	}
	if platform != "" && ocidoc.PlatformString(cfg.Platform) != platform {
		return nil, reject.New(reject.PlatformMismatch, "the index lists the image %s for %s but its config says %s", raw.Digest, platform, ocidoc.PlatformString(cfg.Platform))
	}
	// The layer is read whatever the manifest claims of it; its claims
	// (the descriptor's size, the disk format and size annotations) are
	// then compared with what reading found, so that no claim buys a
	// second read.
	layerDesc := doc.Layers[0].Descriptor
	rec, err := v.layerOf(ctx, repo, layerDesc)
	if err != nil {
		return nil, err
	}
	if rj := rec.Rejection; rj != nil {
		return nil, reject.New(reject.Reason(rj.Code), "%s", rj.Message)
	}
	if rec.Size != layerDesc.Size {
		return nil, reject.New(reject.ManifestShape, "the layer %s is %d bytes but its descriptor says %d", layerDesc.Digest, rec.Size, layerDesc.Size)
	}
	if rec.TarDigest != cfg.RootFS.DiffIDs[0].String() {
		return nil, reject.New(reject.ManifestShape, "the config's diff ID is %s but the layer's tar is %s", cfg.RootFS.DiffIDs[0], rec.TarDigest)
	}
	info := convert.Info{Format: rec.Format, VirtualSize: rec.VirtualSize}
	if err := checkAnnotations(doc.Annotations, cfg.Config.Labels, info); err != nil {
		return nil, err
	}
	if rec.Repository != repo.RepositoryStr() {
		// Read for another repository: the canonical layer is made to
		// exist in this one too, without being read again.
		from := repo.Registry.Repo(rec.Repository)
		if _, err := v.Registry.Upload(ctx, repo, registry.Blob{Digest: rec.Canonical.Digest.String(), MountFrom: &from}); err != nil {
			return nil, err
		}
	}
	canonical, err := v.publish(ctx, repo, raw.Digest, cfg, doc, rec.Canonical, rec.DiffID)
	if err != nil {
		return nil, err
	}
	out := &api.VerifiedImage{
		Platform: ocidoc.PlatformString(cfg.Platform), Source: raw.Digest, Canonical: canonical,
		Format: string(info.Format), VirtualSize: info.VirtualSize, DiskSize: rec.DiskSize,
		Checks: api.ChecksPassed, Guest: rec.Guest,
	}
	for _, kv := range cfg.Config.Env {
		if val, ok := cutEnv(kv, api.EnvDefaultInstancetype); ok {
			out.Instancetype = val
		}
		if val, ok := cutEnv(kv, api.EnvDefaultPreference); ok {
			out.Preference = val
		}
	}
	v.logger().Info("image verified", "repository", repo.RepositoryStr(), "digest", raw.Digest, "canonical", canonical, "format", info.Format, "virtualSize", info.VirtualSize)
	return out, nil
}

// layerOf returns what reading the layer desc finds: from the Store when
// any process sharing it read the layer before, for any repository;
// otherwise it is read now, by one process at a time.
func (v *Verifier) layerOf(ctx context.Context, repo name.Repository, desc ocispec.Descriptor) (*layerRecord, error) {
	comp, err := containerdisk.CompressionOf(desc.MediaType)
	if err != nil {
		return nil, err
	}
	opts := convert.OpenOptions{MaxVirtualSize: v.maxVirtualSize()}
	if v.Store == nil {
		return v.readLayerRecord(ctx, repo, desc, opts)
	}
	key := layerKey(desc.Digest, comp, opts.MaxVirtualSize, v.Version)
	if rec, ok := v.Store.layer(key); ok && v.complete(rec) {
		return rec, nil
	}
	unlock, err := v.Store.lockLayer(ctx, key)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if rec, ok := v.Store.layer(key); ok && v.complete(rec) {
		return rec, nil // read meanwhile by the process that held the lock
	}
	rec, err := v.readLayerRecord(ctx, repo, desc, opts)
	if err != nil {
		return nil, err
	}
	rec.Key = key
	if rec.Guest != nil && rec.Guest.Packages != nil {
		// Before the layer's record: a layer known read has its packages.
		if err := v.Store.putPackages(&packagesRecord{Key: key, OS: rec.Guest.OS, Packages: rec.packages}); err != nil {
			v.logger().Warn("the layer's packages are not kept; its SBOM will be missing", "digest", desc.Digest, "error", err)
		}
	}
	if err := v.Store.putLayer(rec); err != nil {
		v.logger().Warn("the layer's outcome is not kept; it will be read again", "digest", desc.Digest, "error", err)
	}
	return rec, nil
}

// complete reports whether a kept layer record holds all this verifier
// finds: with a boot check, a record kept without its outcome (read
// before the check was on) is read again, not taken as not booted.
func (v *Verifier) complete(rec *layerRecord) bool {
	return v.BootCheck == nil || rec.Rejection != nil || (rec.Guest != nil && rec.Guest.Boot != nil)
}

// readLayerRecord reads the layer desc of repo in full and verifies its
// disk: its outcome is a rejection, or the tar's digest, the disk's
// format and size, and the canonical layer, pushed into repo unless it is
// the pushed one.
func (v *Verifier) readLayerRecord(ctx context.Context, repo name.Repository, desc ocispec.Descriptor, opts convert.OpenOptions) (*layerRecord, error) {
	rec, err := v.readLayerOutcome(ctx, repo, desc, opts)
	if re := reject.As(err); re != nil {
		return &layerRecord{Rejection: &api.Rejection{Code: string(re.Reason), Message: re.Detail}}, nil
	}
	return rec, err
}

func (v *Verifier) readLayerOutcome(ctx context.Context, repo name.Repository, desc ocispec.Descriptor, opts convert.OpenOptions) (*layerRecord, error) {
	comp, err := containerdisk.CompressionOf(desc.MediaType)
	if err != nil {
		return nil, err
	}
	pushed, spool, err := v.readLayer(ctx, repo, desc.Digest.String(), desc, opts)
	if err != nil {
		return nil, err
	}
	defer spool.Discard()
	desc.Size = pushed.layerSize // the descriptor's claim is compared by the caller
	// A disk the stream check found canonical, in a layer imagepipe's
	// writer would make of it (extracted.keep), is its own canonical
	// layer; any other is verified in the spool.
	rec := &layerRecord{Size: pushed.layerSize, TarDigest: pushed.diffID, Repository: repo.RepositoryStr(),
		Canonical: ocispec.Descriptor{MediaType: comp.MediaType(), Digest: desc.Digest, Size: desc.Size},
		DiffID:    pushed.framedDiffID, DiskSize: pushed.size}
	info := pushed.info
	if pushed.streamed == convert.StreamCanonical {
		rec.Guest, rec.packages = v.inspectSpooled(ctx, spool, pushed, opts)
		if pushed.spooled {
			if err := v.boot(ctx, rec.Guest, spool.File, string(info.Format)); err != nil {
				return nil, err
			}
		} else {
			v.unbooted(rec.Guest, "its copy passed the spool share")
		}
	} else {
		img, err := convert.Open(spool.File, pushed.size, opts)
		if err != nil {
			return nil, err
		}
		if _, err := img.Verify(ctx); err != nil {
			return nil, err
		}
		info = img.Info()
		rec.Guest, rec.packages = v.inspect(ctx, spool.File, pushed.size, opts)
		if err := v.boot(ctx, rec.Guest, spool.File, string(info.Format)); err != nil {
			return nil, err
		}
		disk, err := containerdisk.NewDisk(img, containerdisk.Options{DiskFormat: info.Format, Compression: comp, Logger: v.Logger})
		if err != nil {
			return nil, err
		}
		if rec.Canonical, rec.DiffID, rec.DiskSize, err = v.canonicalLayer(ctx, repo, disk, spool.File, desc, pushed); err != nil {
			return nil, err
		}
	}
	rec.Format, rec.VirtualSize = info.Format, info.VirtualSize
	v.logger().Info("layer read", "repository", repo.RepositoryStr(), "layer", desc.Digest, "canonicalLayer", rec.Canonical.Digest, "streamed", pushed.streamed == convert.StreamCanonical)
	return rec, nil
}

// inspectSpooled reads the guest of a disk verified as it streamed, from
// the copy in the spool; a disk whose copy passed the spool share has a
// report that says so.
func (v *Verifier) inspectSpooled(ctx context.Context, spool *convert.OutputFile, pushed *extracted, opts convert.OpenOptions) (*api.GuestReport, []guest.Package) {
	if !pushed.spooled {
		return unread(fmt.Sprintf("the disk's data passes this verification's spool share of %d bytes", v.MaxSpool)), nil
	}
	return v.inspect(ctx, spool.File, pushed.size, opts)
}

func cutEnv(kv, key string) (string, bool) {
	k, v, ok := strings.Cut(kv, "=")
	return v, ok && k == key
}

// checkAnnotations refuses io.imagepipe annotations or labels that
// contradict the disk: they are copied into the canonical image.
func checkAnnotations(annotations, labels map[string]string, info convert.Info) error {
	for _, m := range []map[string]string{annotations, labels} {
		if f, ok := m[api.AnnotationDiskFormat]; ok && f != string(info.Format) {
			return reject.New(reject.AnnotationMismatch, "the annotation %s is %q but the disk is %s", api.AnnotationDiskFormat, f, info.Format)
		}
		if s, ok := m[api.AnnotationVirtualSize]; ok {
			if n, err := strconv.ParseInt(s, 10, 64); err != nil || n != info.VirtualSize {
				return reject.New(reject.AnnotationMismatch, "the annotation %s is %q but the disk's virtual size is %d bytes", api.AnnotationVirtualSize, s, info.VirtualSize)
			}
		}
	}
	return nil
}

// readBlob reads a small blob, at most limit bytes, checking its size and
// digest against desc.
func (v *Verifier) readBlob(ctx context.Context, repo name.Repository, desc ocispec.Descriptor, limit int64) ([]byte, error) {
	if desc.Size > limit {
		return nil, reject.New(reject.ManifestShape, "the blob %s is %d bytes, over the limit of %d", desc.Digest, desc.Size, limit)
	}
	rc, err := v.Registry.OpenBlob(ctx, repo, desc.Digest.String())
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, limit+1))
	if err != nil {
		return nil, fmt.Errorf("reading blob %s: %w", desc.Digest, err)
	}
	if int64(len(b)) != desc.Size {
		return nil, reject.New(reject.ManifestShape, "the blob %s is %d bytes but its descriptor says %d", desc.Digest, len(b), desc.Size)
	}
	if digest.FromBytes(b) != desc.Digest {
		return nil, fmt.Errorf("the registry served blob %s with other content", desc.Digest)
	}
	return b, nil
}

// readLayer reads the pushed layer in full, streaming its disk through
// the stream check, and again into the spool when the check dropped data
// that the usual verification needs. The caller discards the spool.
func (v *Verifier) readLayer(ctx context.Context, repo name.Repository, source string, desc ocispec.Descriptor, opts convert.OpenOptions) (*extracted, *convert.OutputFile, error) {
	spool, err := v.newSpool()
	if err != nil {
		return nil, nil, err
	}
	pushed, err := v.extract(ctx, repo, desc, spool, &opts)
	if err == nil && pushed.mustReread() {
		v.logger().Info("reading the layer again", "repository", repo.RepositoryStr(), "digest", source)
		spool.Discard()
		if spool, err = v.newSpool(); err != nil {
			return nil, nil, err
		}
		pushed, err = v.extract(ctx, repo, desc, spool, nil)
	}
	if err != nil {
		spool.Discard()
		return nil, nil, err
	}
	return pushed, spool, nil
}

// newSpool creates a file for the disk being verified.
func (v *Verifier) newSpool() (*convert.OutputFile, error) {
	dir := v.TempDir
	if dir == "" {
		dir = os.TempDir()
	}
	spool, err := convert.CreateOutput(filepath.Join(dir, "imagepipe-gate.disk"), false)
	if err != nil {
		return nil, fmt.Errorf("creating the disk spool: %w", err)
	}
	return spool, nil
}

// boundedSpool refuses a disk whose data in the spool passes limit bytes
// (0: no bound), so that one verification cannot take the disk the others
// spool to.
type boundedSpool struct {
	*convert.OutputFile
	limit int64
}

// spoolCopy copies a disk that streams past a StreamCheck to the spool,
// until the data there passes limit bytes (0: no bound); over is set
// then, and the copy stops without an error: a canonical disk is
// verified without it. Bytes the check diverts are in the spool already,
// so its fallback writes nothing, and refuses the disk as boundedSpool
// does once the copy stopped.
type spoolCopy struct {
	spool *convert.OutputFile
	limit int64
	over  bool
}

func (c *spoolCopy) Write(p []byte) (int, error) {
	if c.over {
		return len(p), nil
	}
	n, err := c.spool.Write(p)
	if err == nil && c.limit > 0 && c.spool.Stored() > c.limit {
		c.over = true
	}
	return n, err
}

func (c *spoolCopy) fallback() io.Writer {
	return writerFunc(func(p []byte) (int, error) {
		if c.over {
			return 0, errOverSpool(c.limit)
		}
		return len(p), nil
	})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func errOverSpool(limit int64) error {
	return reject.New(reject.VerificationLimit, "the disk holds more than %d bytes of data to spool, the bound of one verification; imagectl's qcow2 disks are verified without a spool", limit)
}

func (b boundedSpool) Write(p []byte) (int, error) {
	n, err := b.OutputFile.Write(p)
	if err == nil && b.limit > 0 && b.Stored() > b.limit {
		return n, errOverSpool(b.limit)
	}
	return n, err
}

// extracted is what reading a pushed layer found.
type extracted struct {
	layerSize int64  // bytes of the pushed layer
	diffID    string // sha256 of the layer's tar
	size      int64  // size of disk/disk.img
	// framedDiffID is the sha256 of the tar imagepipe's writer would
	// make around the pushed disk: the canonical layer's diff ID when the
	// canonical disk is the pushed one. "" when unknown (the pushed tar
	// has imagepipe's headers but another end).
	framedDiffID string
	// ownCompression: the layer's compression framing is what
	// imagepipe's writers emit (LayerReader.OwnCompressionFraming).
	ownCompression bool
	// streamed is what the stream check found of the disk.
	streamed convert.StreamOutcome
	info     convert.Info // the disk's, when streamed is StreamCanonical
	// spooled: the spool holds the whole disk. Only a streamed disk
	// whose data passed the spool share is not there.
	spooled bool
}

// keep reports whether the pushed layer may stand as the canonical layer
// whose tar has diff ID canonical: its tar is that tar byte for byte and
// its compression framing is imagepipe's. Anything else, however benign,
// is written anew, so that CDI reads a layer imagepipe framed.
func (x *extracted) keep(canonical string) bool {
	return x.diffID == canonical && x.ownCompression
}

// mustReread reports whether the disk needs the spool and the spool
// lacks it: its copy stopped at the spool share.
func (x *extracted) mustReread() bool {
	return !x.spooled && x.needsSpool()
}

// needsSpool reports whether the disk must be verified in the spool,
// or the gate must write a layer of it from there: the stream check
// dropped its data, or the pushed disk is canonical in a layer that is
// not imagepipe's.
func (x *extracted) needsSpool() bool {
	return x.streamed == convert.StreamLost || (x.streamed == convert.StreamCanonical && !x.keep(x.framedDiffID))
}

// extract streams the layer from the registry and checks its shape and
// framing in full. With stream set (the options the disk is opened with),
// disk/disk.img goes through a convert.StreamCheck, which verifies an
// imagepipe-written disk as it passes and sends any other to spool;
// without it, the disk goes to spool. The spool leaves holes for zero
// blocks.
func (v *Verifier) extract(ctx context.Context, repo name.Repository, desc ocispec.Descriptor, spool *convert.OutputFile, stream *convert.OpenOptions) (*extracted, error) {
	if err := checkDeclared(ctx, "the layer descriptor", desc.Size); err != nil {
		return nil, err
	}
	rc, err := v.Registry.OpenBlob(ctx, repo, desc.Digest.String())
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	ahead := newReadAhead(rc)
	defer ahead.Close()
	counted := &countingReader{r: ahead}
	lr, err := containerdisk.OpenLayer(desc.MediaType, counted)
	if err != nil {
		return nil, err
	}
	defer lr.Close()
	if lr.DiskSize() > v.maxDiskSize() {
		return nil, reject.New(reject.VirtualSize, "disk/disk.img is %d bytes, over the limit of %d for a disk of at most %d bytes", lr.DiskSize(), v.maxDiskSize(), v.maxVirtualSize())
	}
	if err := checkDeclared(ctx, "disk/disk.img's tar header", lr.DiskSize()); err != nil {
		return nil, err
	}
	// The spool's writes run beside the decompression, on a core of their
	// own. The pushed disk's diff ID in imagepipe's framing is its own
	// when the pushed tar's headers are imagepipe's (the end marker is
	// compared after); else it is hashed there too. A layer whose start
	// (tar headers, gzip header, zstd lead frame) is not imagepipe's
	// cannot stand as the canonical layer, which the gate then writes
	// from the spool: its disk goes there at once, unchecked as it
	// streams.
	head, tail := containerdisk.TarFraming(lr.DiskSize())
	ownHead := bytes.Equal(lr.Head(), head)
	var sum hash.Hash
	var check *convert.StreamCheck
	var copied *spoolCopy
	sink := io.Writer(boundedSpool{spool, v.MaxSpool})
	if stream != nil && ownHead && lr.OwnCompressionFraming() {
		// A disk the check finds canonical needs no spool to be verified,
		// but its guest is read at random: the disk is copied to the spool
		// as it passes, while it fits this verification's share.
		copied = &spoolCopy{spool: spool, limit: v.MaxSpool}
		check = convert.NewStreamCheck(lr.DiskSize(), *stream, copied.fallback())
		sink = io.MultiWriter(copied, check)
	}
	if !ownHead {
		sum = sha256.New()
		sum.Write(head)
		sink = io.MultiWriter(sink, hashWriter{sum})
	}
	declared := &declaredVirtualSize{ctx: ctx, w: sink}
	sink = declared
	pr, pw := io.Pipe()
	var wg sync.WaitGroup
	wg.Go(func() {
		n, err := io.CopyBuffer(sink, pr, make([]byte, 1<<20))
		v.decompressed.Add(n)
		pr.CloseWithError(err)
	})
	diffID, err := lr.CopyDisk(ctx, pw)
	pw.CloseWithError(err)
	wg.Wait()
	v.spooled.Add(spool.Stored())
	if declared.err != nil {
		return nil, declared.err
	}
	if err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, fmt.Errorf("reading layer %s: %w", desc.Digest, err)
		}
		return nil, err
	}
	x := &extracted{layerSize: counted.n, diffID: diffID, size: lr.DiskSize(), ownCompression: lr.OwnCompressionFraming(), streamed: convert.StreamDiverted, spooled: true}
	if check != nil {
		if x.streamed, x.info, err = check.Finish(ctx); err != nil {
			return nil, err
		}
		x.spooled = !copied.over
	}
	if err := spool.Finish(); err != nil {
		return nil, fmt.Errorf("writing the disk spool: %w", err)
	}
	switch {
	case !ownHead:
		sum.Write(tail)
		x.framedDiffID = fmt.Sprintf("sha256:%x", sum.Sum(nil))
	case bytes.Equal(lr.Tail(), tail):
		x.framedDiffID = diffID // the pushed tar is imagepipe's, byte for byte
	}
	if x.spooled && x.needsSpool() {
		x.streamed = convert.StreamDiverted // the copy in the spool serves
	}
	return x, nil
}

// canonicalLayer is the canonical layer of disk, pushed into repo unless
// the pushed layer may stand for it (extracted.keep: its tar is exactly
// the tar imagepipe writes for the verified disk, in imagepipe's
// compression framing), with its diff ID and disk size.
func (v *Verifier) canonicalLayer(ctx context.Context, repo name.Repository, disk *containerdisk.Disk, spool io.ReaderAt, pushedLayer ocispec.Descriptor, pushed *extracted) (ocispec.Descriptor, string, int64, error) {
	diffID, size, err := canonicalDiffID(ctx, disk, spool, pushed)
	if err != nil {
		return ocispec.Descriptor{}, "", 0, err
	}
	comp, _ := containerdisk.CompressionOf(pushedLayer.MediaType)
	layer := ocispec.Descriptor{MediaType: comp.MediaType(), Digest: pushedLayer.Digest, Size: pushedLayer.Size}
	if pushed.keep(diffID) {
		return layer, diffID, size, nil
	}
	info, err := publish.Layer(ctx, v.Registry, repo, disk)
	if err != nil {
		return ocispec.Descriptor{}, "", 0, fmt.Errorf("pushing the canonical layer: %w", err)
	}
	if info.DiffID != diffID {
		return ocispec.Descriptor{}, "", 0, fmt.Errorf("the canonical layer written has diff ID %s, not %s", info.DiffID, diffID)
	}
	layer.Digest, layer.Size = digest.Digest(info.Digest), info.Size
	v.logger().Info("canonical layer written", "repository", repo.RepositoryStr(), "digest", info.Digest, "bytes", info.Size)
	return layer, diffID, size, nil
}

// publish makes sure the canonical image with layer (of diff ID diffID)
// is in repo and returns its manifest digest. internal/containerdisk
// assembles its manifest and config, as it does imagectl's, from the
// verified values and the pushed ones that passed their checks, so that
// an image built by imagectl publishes to its own digest and costs
// nothing: its manifest is not written again.
func (v *Verifier) publish(ctx context.Context, repo name.Repository, source string, cfg *ocispec.Image, doc *ocidoc.Document, layer ocispec.Descriptor, diffID string) (string, error) {
	img, err := containerdisk.AssembleImage(containerdisk.ImageConfig{
		Platform: cfg.Platform, Created: cfg.Created,
		Labels: cfg.Config.Labels, Env: cfg.Config.Env,
	}, layer, diffID, doc.Annotations)
	if err != nil {
		return "", err
	}
	d := img.Digest
	if d == source {
		return d, nil // the pushed image is the canonical one, read a moment ago
	}
	if err := publish.Image(ctx, v.Registry, repo.Digest(d), img); err != nil {
		return "", fmt.Errorf("pushing the canonical image: %w", err)
	}
	return d, nil
}

// canonicalDiffID is the diff ID and disk size of the canonical layer of
// disk. When the canonical disk is the pushed one (an imagectl build),
// comparing it with the spool, which costs no hash, proves the diff ID is
// the one computed while the layer was read; otherwise the canonical tar
// is hashed.
func canonicalDiffID(ctx context.Context, disk *containerdisk.Disk, spool io.ReaderAt, pushed *extracted) (string, int64, error) {
	same, err := disk.SameAs(ctx, spool, pushed.size)
	if err != nil {
		return "", 0, err
	}
	if same && pushed.framedDiffID != "" {
		return pushed.framedDiffID, pushed.size, nil
	}
	return disk.TarDigest(ctx)
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// hashWriter feeds a hash.
type hashWriter struct{ h hash.Hash }

func (w hashWriter) Write(p []byte) (int, error) { return w.h.Write(p) }
