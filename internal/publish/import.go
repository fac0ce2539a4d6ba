package publish

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/imagepipe/imagepipe/internal/containerdisk"
	"github.com/imagepipe/imagepipe/internal/imageref"
	"github.com/imagepipe/imagepipe/internal/ocidoc"
	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// Disk is the disk an import stores as the single file of its layer;
// *containerdisk.Disk is the one imagectl and the gate use.
type Disk interface {
	// Describe says what is known of the disk before it is read.
	Describe() containerdisk.Description
	// Prepare validates the whole disk, so that a rejection comes before
	// anything is sent, and returns the bytes its data occupies.
	Prepare(ctx context.Context) (allocated int64, err error)
	// WriteLayer writes the compressed layer to w; it may be called again
	// when an upload has to start over. progress, when set, is told of the
	// uncompressed bytes done and their total.
	WriteLayer(ctx context.Context, w io.Writer, progress func(done, total int64)) (containerdisk.LayerInfo, error)
}

var _ Disk = (*containerdisk.Disk)(nil)

// Source is where the disk came from, as far as an import cares: the
// digest of its original bytes, possibly still being computed, and a name
// for its upload. *source.Image is one.
type Source interface {
	// WaitDigest returns the digest ("sha256:<hex>"), waiting for it when
	// it is still being computed.
	WaitDigest(ctx context.Context) (string, error)
	// DigestDeferred reports whether the digest is computed while the
	// import runs; Import then builds the layer at the same time.
	DigestDeferred() bool
	// UploadName, when not "", names the layer upload so that a later run
	// can resume it even when this one was interrupted before the digest
	// was known: e.g. a local file's path, device, inode, size and times. A
	// name that matches another content costs only a fresh upload: the
	// registry checks the layer's digest before it accepts it.
	UploadName() string
}

// resumableError marks an import whose build stopped for another reason
// (the source's hashing failed, the caller gave up) while its upload was
// kept for a later run.
type resumableError struct{ err error }

func (e *resumableError) Error() string        { return e.err.Error() }
func (e *resumableError) Unwrap() error        { return e.err }
func (e *resumableError) Is(target error) bool { return target == registry.ErrResumable }

// ImportOptions describe the image around the disk. The zero value builds
// an image for linux/amd64 with no labels and no time.
type ImportOptions struct {
	// Architecture, OS and Variant of the image config: the platform
	// (see Platform; default linux/amd64, no variant).
	Architecture, OS, Variant string
	// Append adds the image to the image index at the tag, making one
	// from what the tag holds, instead of replacing what the tag holds;
	// see Importer.Import.
	Append bool
	// Labels are added to the image config.
	Labels map[string]string
	// DefaultInstancetype and DefaultPreference become the config
	// environment variables CDI turns into volume labels.
	DefaultInstancetype, DefaultPreference string
	// OSName is recorded in the annotations when set.
	OSName string
	// Created is recorded when non-zero; by default images carry no time,
	// so that they are reproducible.
	Created time.Time
	// Creator names the building tool and version.
	Creator string
	// Progress, when set, is called with uncompressed layer bytes done and
	// the total as the layer is built.
	Progress func(done, total int64)
}

func (o ImportOptions) withDefaults() ImportOptions {
	if o.Architecture == "" {
		o.Architecture = "amd64"
	}
	if o.OS == "" {
		o.OS = "linux"
	}
	return o
}

// platform is the platform the options build for.
func (o ImportOptions) platform() registry.Platform {
	return registry.Platform{OS: o.OS, Architecture: o.Architecture, Variant: o.Variant}
}

// buildKey identifies an image by everything that determines its bytes.
func buildKey(sourceDigest string, d containerdisk.Description, o ImportOptions) string {
	b, _ := json.Marshal(struct {
		Version            int                       `json:"v"`
		Source             string                    `json:"source"`
		DiskFormat         string                    `json:"disk"`
		Compression        containerdisk.Compression `json:"compression"`
		Arch, OS           string                    `json:",omitempty"`
		Variant            string                    `json:",omitempty"`
		Labels             map[string]string         `json:"labels,omitempty"`
		Instancetype, Pref string                    `json:",omitempty"`
		OSName, Creator    string                    `json:",omitempty"`
		Created            string                    `json:",omitempty"`
		Gzip               string                    `json:",omitempty"` // the compressor decides the bytes
	}{1, sourceDigest, d.DiskFormat, d.Compression, o.Architecture, o.OS, o.Variant, o.Labels,
		o.DefaultInstancetype, o.DefaultPreference, o.OSName, o.Creator, formatCreated(o.Created), d.Compression.Compressor()})
	return fmt.Sprintf("sha256:%x", sha256.Sum256(b))
}

func formatCreated(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}

// Importer imports disks into a registry as containerDisks.
type Importer struct {
	Registry *registry.Client
	// CacheDir holds the build records (see builds.go); "" keeps none.
	// The registry client keeps its upload state in its own.
	CacheDir string
	Logger   *slog.Logger
}

func (im *Importer) logger() *slog.Logger {
	if im.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return im.Logger
}

func (im *Importer) builds() cacheDir { return cacheDir{dir: im.CacheDir, logger: im.logger()} }

// Import builds a containerDisk from disk and pushes it to ref. When this
// machine's build record says it already pushed the same build (same
// source digest, disk and options) to this registry, and the registry
// still holds exactly that manifest and its blobs, the image is only
// tagged (or, from another repository, copied by mounting its blobs);
// anything else is built anew, whatever the registry's tags say. A
// rejection of the disk (containerdisk.Rejected) leaves nothing behind; a
// network failure leaves a resumable upload.
//
// When src's digest is still being computed (Source.DigestDeferred), the
// build starts at once and the look-up for an identical image happens as
// soon as the digest is known; finding one stops the build.
//
// With opts.Append the image is pushed by digest, untagged, and then added
// to the image index at ref (see registry.Client.AddToIndex), so that one tag names an
// image per platform; the tag only ever moves from one complete index to
// another. Without it, the tag is overwritten like crane push does, and
// the result's ReplacedIndex says when it held an index before.
func (im *Importer) Import(ctx context.Context, ref name.Tag, disk Disk, src Source, opts ImportOptions) (*api.ImportResult, error) {
	opts = opts.withDefaults()
	platform, err := registry.ParsePlatform(opts.platform().String()) // checked as --platform is
	if err != nil {
		return nil, err
	}
	if _, err := imageref.Tenant(ref.RepositoryStr()); err != nil {
		return nil, err
	}
	var held []string
	if !opts.Append {
		held = im.heldIndex(ctx, ref)
	}
	res, err := im.importImage(ctx, ref, disk, src, opts)
	if err != nil {
		return nil, err
	}
	res.Platform = platform.String()
	if !opts.Append {
		res.ReplacedIndex = held
		return res, nil
	}
	index, platforms, err := im.Registry.AddToIndex(ctx, ref, res.Digest, platform)
	if err != nil {
		return nil, err
	}
	res.ImageDigest, res.Digest, res.Platforms = res.Digest, index, platforms
	res.Pinned = ref.Context().Digest(index).String()
	return res, nil
}

// heldIndex returns the platforms of the image index ref holds, or nil
// when it holds none (or cannot be read: the answer only informs).
func (im *Importer) heldIndex(ctx context.Context, ref name.Tag) []string {
	m, err := im.Registry.FetchManifest(ctx, ref)
	if err != nil || !m.MediaType.IsIndex() {
		return nil
	}
	doc, err := ocidoc.ParseDocument(string(m.MediaType), m.Bytes)
	if err != nil || !doc.IsIndex() {
		return nil
	}
	out := make([]string, len(doc.Manifests))
	for i, d := range doc.Manifests {
		out[i] = "unknown"
		if d.Platform != nil && d.Platform.OS != "" && d.Platform.Architecture != "" {
			out[i] = ocidoc.PlatformString(*d.Platform)
		}
	}
	return out
}

// importImage builds the image, or finds an identical one, and writes it
// to ref, or with opts.Append by digest to ref's repository.
func (im *Importer) importImage(ctx context.Context, ref name.Tag, disk Disk, src Source, opts ImportOptions) (*api.ImportResult, error) {
	if src.DigestDeferred() {
		return im.importWhileHashing(ctx, ref, disk, src, opts)
	}
	digest, err := src.WaitDigest(ctx)
	if err != nil {
		return nil, err
	}
	desc := disk.Describe()
	key := buildKey(digest, desc, opts)
	if res, err := im.findExisting(ctx, ref, key, digest, desc, opts.Append); err != nil || res != nil {
		return res, err
	}
	upload := knownKey(key)
	if name := src.UploadName(); name != "" {
		upload = knownKey(uploadNameKey(name, desc, opts))
	}
	b, err := im.build(ctx, ref, upload, disk, opts)
	if err != nil {
		return nil, err
	}
	return im.publish(ctx, ref, key, digest, desc, opts, b)
}

// importWhileHashing builds the layer while src's digest is computed, and
// stops the build when the digest names an image that exists.
func (im *Importer) importWhileHashing(ctx context.Context, ref name.Tag, disk Disk, src Source, opts ImportOptions) (*api.ImportResult, error) {
	desc := disk.Describe()
	buildCtx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	type found struct {
		digest string
		res    *api.ImportResult
		err    error
	}
	lookup := make(chan found, 1)
	later := new(uploadKey)
	named := src.UploadName() != ""
	if named {
		later.set(uploadNameKey(src.UploadName(), desc, opts))
	}
	go func() {
		d, err := src.WaitDigest(buildCtx)
		if err != nil {
			lookup <- found{err: err}
			stop(err)
			return
		}
		key := buildKey(d, desc, opts)
		res, err := im.findExisting(buildCtx, ref, key, d, desc, opts.Append)
		if res == nil && err == nil && !named {
			later.set(key) // the upload can now be resumed by a later run
		}
		lookup <- found{digest: d, res: res, err: err}
		switch {
		case res != nil:
			stop(errFoundExisting)
		case err != nil:
			stop(err)
		}
	}()
	b, buildErr := im.build(buildCtx, ref, later, disk, opts)
	if buildErr != nil && !errors.Is(context.Cause(buildCtx), errFoundExisting) {
		if cause := context.Cause(buildCtx); cause != nil {
			if errors.Is(buildErr, registry.ErrResumable) {
				return nil, &resumableError{cause}
			}
			return nil, cause // hashing failed, or the caller gave up
		}
		return nil, buildErr
	}
	f := <-lookup
	switch {
	case f.err != nil:
		return nil, f.err
	case f.res != nil:
		return f.res, nil
	case buildErr != nil:
		return nil, buildErr
	}
	return im.publish(ctx, ref, buildKey(f.digest, desc, opts), f.digest, desc, opts, b)
}

// uploadKey names an upload so that a later run can resume it: the build
// key, known at once or, while the source is still being hashed, later.
// A nil *uploadKey names nothing.
type uploadKey struct{ v atomic.Pointer[string] }

func knownKey(key string) *uploadKey {
	k := new(uploadKey)
	k.set(key)
	return k
}

func (k *uploadKey) set(key string) { k.v.Store(&key) }

func (k *uploadKey) get() string {
	if k == nil {
		return ""
	}
	if p := k.v.Load(); p != nil {
		return *p
	}
	return ""
}

// uploadNameKey names the upload of a source known by name (see
// Source.UploadName) rather than by digest, with everything else that
// decides the layer's bytes.
func uploadNameKey(uploadName string, d containerdisk.Description, o ImportOptions) string {
	return buildKey("name:"+uploadName, d, o)
}

// errFoundExisting stops a build that an identical image made unnecessary.
var errFoundExisting = errors.New("an identical image exists")

// findExisting returns the result of reusing an image this machine
// already built with key (see builds.go), or nil when there is none that
// the registry still fully holds. byDigest puts it in ref's repository
// untagged rather than under ref.
func (im *Importer) findExisting(ctx context.Context, ref name.Tag, key, sourceDigest string, desc containerdisk.Description, byDigest bool) (*api.ImportResult, error) {
	for _, rec := range im.builds().lookupBuilds(key, ref.RegistryStr(), ref.RepositoryStr()) {
		result := newResult(ref, sourceDigest, desc)
		found, err := im.reuseBuild(ctx, ref, rec, result, byDigest)
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		if err != nil {
			im.logger().Debug("reusing an earlier build failed; building", "repository", rec.Repository, "digest", rec.Digest, "error", err)
			continue
		}
		if found {
			return result, nil
		}
	}
	return nil, nil
}

func newResult(ref name.Tag, sourceDigest string, desc containerdisk.Description) *api.ImportResult {
	return &api.ImportResult{
		Reference: ref.String(), SourceDigest: sourceDigest,
		VirtualSize: desc.VirtualSize, DiskFormat: desc.DiskFormat,
	}
}

// built is a layer in the registry and what is known of its disk.
type built struct {
	layer     containerdisk.LayerInfo
	sent      int64
	allocated int64
	forget    func() // drops the upload's record once the manifest is put
}

// build validates the disk, then builds and uploads the layer. key names
// the upload for resuming, possibly only later. A layer that an earlier run
// committed under the same key, and that the registry still holds, is not
// built again (the run was stopped before its manifest).
func (im *Importer) build(ctx context.Context, ref name.Tag, key *uploadKey, disk Disk, opts ImportOptions) (built, error) {
	var allocated int64
	blob := registry.Blob{
		Key: key.get,
		// Validate the whole disk before anything is sent: an invalid L2
		// table is refused with nothing uploaded.
		Prepare: func(ctx context.Context) (err error) {
			allocated, err = disk.Prepare(ctx)
			return err
		},
		Write: func(ctx context.Context, w io.Writer) (string, map[string]string, error) {
			layer, err := disk.WriteLayer(ctx, w, opts.Progress)
			return layer.Digest, layerLabels(layer, allocated), err
		},
		// A refused disk's bytes, and those of a build an identical image
		// made unnecessary, must not stay on the registry.
		Discard: func(err error) bool {
			return containerdisk.Rejected(err) || errors.Is(context.Cause(ctx), errFoundExisting)
		},
	}
	up, err := im.Registry.Upload(ctx, ref.Context(), blob)
	if err != nil {
		return built{sent: up.Sent}, err
	}
	b, ok := fromLabels(up)
	if !ok && up.Earlier {
		// A record this version cannot read: build the layer anew.
		blob.Key = nil
		if up, err = im.Registry.Upload(ctx, ref.Context(), blob); err != nil {
			return built{sent: up.Sent}, err
		}
		b, ok = fromLabels(up)
	}
	if !ok {
		return built{}, fmt.Errorf("the layer uploaded to %s has no valid description", ref.Context())
	}
	if up.Earlier {
		im.logger().Info("the layer was uploaded by an interrupted run; publishing it", "reference", ref.String(), "digest", b.layer.Digest)
	}
	return b, nil
}

// Labels a layer's upload records, so that a run that finds it committed
// by an earlier one knows what it holds.
const (
	labelDiffID    = "diffID"
	labelSize      = "size"
	labelAllocated = "allocated"
)

func layerLabels(l containerdisk.LayerInfo, allocated int64) map[string]string {
	return map[string]string{labelDiffID: l.DiffID, labelSize: strconv.FormatInt(l.Size, 10), labelAllocated: strconv.FormatInt(allocated, 10)}
}

// fromLabels reads the layer an upload committed; ok is false when its
// labels are not what layerLabels writes.
func fromLabels(up registry.Uploaded) (built, bool) {
	size, err1 := strconv.ParseInt(up.Labels[labelSize], 10, 64)
	allocated, err2 := strconv.ParseInt(up.Labels[labelAllocated], 10, 64)
	diffID := up.Labels[labelDiffID]
	if err1 != nil || err2 != nil || size <= 0 || allocated < 0 || imageref.CheckDigest(diffID) != nil || imageref.CheckDigest(up.Digest) != nil {
		return built{}, false
	}
	return built{layer: containerdisk.LayerInfo{DiffID: diffID, Digest: up.Digest, Size: size}, sent: up.Sent, allocated: allocated, forget: up.Forget}, true
}

// publish pushes the config and the manifest, which writes ref (with
// opts.Append, the manifest goes to ref's repository by digest).
func (im *Importer) publish(ctx context.Context, ref name.Tag, key, sourceDigest string, desc containerdisk.Description, opts ImportOptions, b built) (*api.ImportResult, error) {
	annotations := map[string]string{
		api.AnnotationSourceDigest:  sourceDigest,
		api.AnnotationSourceFormat:  desc.SourceFormat,
		api.AnnotationDiskFormat:    desc.DiskFormat,
		api.AnnotationVirtualSize:   strconv.FormatInt(desc.VirtualSize, 10),
		api.AnnotationAllocatedSize: strconv.FormatInt(b.allocated, 10),
		api.AnnotationBuildKey:      key,
	}
	if opts.Creator != "" {
		annotations[api.AnnotationCreator] = opts.Creator
	}
	if opts.OSName != "" {
		annotations[api.AnnotationOSName] = opts.OSName
	}
	if !opts.Created.IsZero() {
		annotations[api.AnnotationCreated] = formatCreated(opts.Created)
	}
	img, err := containerdisk.AssembleImage(imageConfig(opts, annotations), ocispec.Descriptor{
		MediaType: desc.Compression.MediaType(),
		Digest:    digest.Digest(b.layer.Digest),
		Size:      b.layer.Size,
	}, b.layer.DiffID, annotations)
	if err != nil {
		return nil, err
	}
	// The layer is committed; the manifest, last, writes the tag.
	var where name.Reference = ref
	if opts.Append {
		where = ref.Context().Digest(img.Digest)
	}
	if err := Image(ctx, im.Registry, where, img); err != nil {
		return nil, err
	}
	if b.forget != nil {
		b.forget()
	}
	result := newResult(ref, sourceDigest, desc)
	result.LayerSize, result.UploadedBytes = b.layer.Size, b.sent
	result.Digest = img.Digest
	result.Pinned = ref.Context().Digest(result.Digest).String()
	im.builds().rememberBuild(buildRecord{Key: key, Registry: ref.RegistryStr(), Repository: ref.RepositoryStr(), Digest: result.Digest,
		Config: img.ConfigDesc.Digest.String(), Layer: b.layer.Digest, LayerSize: b.layer.Size})
	im.logger().Info("imported", "reference", ref.String(), "digest", result.Digest, "bytes", b.layer.Size)
	return result, nil
}

// reuseBuild writes ref from the image rec records, after checking that
// the registry holds exactly that manifest (fetched by digest, so its
// bytes are the ones pushed) with the recorded config and layer, and both
// blobs in rec's repository. When rec is in another repository of the
// registry, the image is copied into ref's, mounting the blobs. byDigest
// leaves ref alone: the image only has to be in ref's repository. It
// reports false, forgetting rec, when the registry no longer holds it
// all; the caller then builds.
func (im *Importer) reuseBuild(ctx context.Context, ref name.Tag, rec buildRecord, result *api.ImportResult, byDigest bool) (bool, error) {
	from := ref.Context().Registry.Repo(rec.Repository).Digest(rec.Digest) // lookupBuilds kept ref's registry only
	manifest, ok, err := im.checkBuild(ctx, from, rec)
	if err != nil || !ok {
		if err == nil {
			im.builds().forgetBuild(rec)
		}
		return false, err
	}
	switch {
	case rec.Repository == ref.RepositoryStr() && byDigest:
		// checkBuild found it there.
	case rec.Repository == ref.RepositoryStr():
		_, err = im.Registry.Push(ctx, ref, registry.RawManifest{MediaType: types.OCIManifestSchema1, Bytes: manifest})
	case byDigest:
		_, err = im.Registry.Copy(ctx, from, ref.Context().Digest(rec.Digest), registry.CopyOptions{})
	default:
		_, err = im.Registry.Copy(ctx, from, ref, registry.CopyOptions{})
	}
	if err != nil {
		var terr *transport.Error
		if errors.As(err, &terr) && terr.StatusCode == http.StatusBadRequest {
			return false, nil // a blob went in the meantime: build
		}
		return false, err
	}
	rec.Repository = ref.RepositoryStr()
	im.builds().rememberBuild(rec)
	result.Digest = rec.Digest
	result.Pinned = ref.Context().Digest(rec.Digest).String()
	result.Reused = true
	result.LayerSize = rec.LayerSize
	return true, nil
}

// checkBuild fetches the manifest at pinned (go-containerregistry checks
// that its bytes have the digest) and checks that it is the one rec
// describes and that its repository holds the config and the layer. ok is
// false when something is missing or different.
func (im *Importer) checkBuild(ctx context.Context, pinned name.Digest, rec buildRecord) (manifest []byte, ok bool, err error) {
	m, err := im.Registry.FetchManifest(ctx, pinned) // checks the digest
	var terr *transport.Error
	if errors.As(err, &terr) && terr.StatusCode == http.StatusNotFound {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	var doc ocispec.Manifest
	if err := json.Unmarshal(m.Bytes, &doc); err != nil || len(doc.Layers) != 1 ||
		doc.Config.Digest.String() != rec.Config || doc.Layers[0].Digest.String() != rec.Layer ||
		doc.Layers[0].Size != rec.LayerSize || doc.Annotations[api.AnnotationBuildKey] != rec.Key {
		return nil, false, nil
	}
	for _, d := range []string{rec.Config, rec.Layer} {
		up, err := im.Registry.Upload(ctx, pinned.Context(), registry.Blob{Digest: d})
		if err != nil || !up.Held {
			return nil, false, err
		}
	}
	return m.Bytes, true, nil
}

// imageConfig is the image config of an import: its platform, labels
// (the annotations plus the user's), the instancetype environment and
// the creation time, to the second.
func imageConfig(o ImportOptions, annotations map[string]string) containerdisk.ImageConfig {
	labels := maps.Clone(annotations)
	maps.Copy(labels, o.Labels)
	var env []string
	if o.DefaultInstancetype != "" {
		env = append(env, api.EnvDefaultInstancetype+"="+o.DefaultInstancetype)
	}
	if o.DefaultPreference != "" {
		env = append(env, api.EnvDefaultPreference+"="+o.DefaultPreference)
	}
	cfg := containerdisk.ImageConfig{
		Platform: ocispec.Platform{Architecture: o.Architecture, OS: o.OS, Variant: o.Variant},
		Labels:   labels, Env: env,
	}
	if !o.Created.IsZero() {
		t := o.Created.UTC().Truncate(time.Second)
		cfg.Created = &t
	}
	return cfg
}
