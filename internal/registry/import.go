package registry

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"strconv"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/imagepipe/imagepipe/internal/containerdisk"
	"github.com/imagepipe/imagepipe/internal/imageref"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// Disk is the disk an import stores as the single file of its layer;
// *containerdisk.Disk is the one imagectl uses. Keeping it an interface
// keeps this package to the protocol: it never reads a disk itself.
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

// ErrResumable marks an import that stopped (interrupted, or the registry
// or the network failed) with its upload session kept and recorded, so
// that running the same import again resumes it.
var ErrResumable = errors.New("the upload is kept for a later run")

// resumableError wraps an import's error when its upload can be resumed.
type resumableError struct{ err error }

func (e *resumableError) Error() string        { return e.err.Error() }
func (e *resumableError) Unwrap() error        { return e.err }
func (e *resumableError) Is(target error) bool { return target == ErrResumable }

// ImportOptions describe the image around the disk. The zero value builds
// an image for linux/amd64 with no labels and no time.
type ImportOptions struct {
	// Architecture, OS and Variant of the image config: the platform
	// (see Platform; default linux/amd64, no variant).
	Architecture, OS, Variant string
	// Append adds the image to the image index at the tag, making one
	// from what the tag holds, instead of replacing what the tag holds;
	// see Client.Import.
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
func (o ImportOptions) platform() Platform {
	return Platform{OS: o.OS, Architecture: o.Architecture, Variant: o.Variant}
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
// to the image index at ref (see addToIndex), so that one tag names an
// image per platform; the tag only ever moves from one complete index to
// another. Without it, the tag is overwritten like crane push does, and
// the result's ReplacedIndex says when it held an index before.
func (c *Client) Import(ctx context.Context, ref name.Tag, disk Disk, src Source, opts ImportOptions) (*api.ImportResult, error) {
	opts = opts.withDefaults()
	platform := opts.platform()
	if err := platform.validate(); err != nil {
		return nil, err
	}
	if _, err := imageref.Tenant(ref.RepositoryStr()); err != nil {
		return nil, err
	}
	var held []string
	if !opts.Append {
		held = c.heldIndex(ctx, ref)
	}
	res, err := c.importImage(ctx, ref, disk, src, opts)
	if err != nil {
		return nil, err
	}
	res.Platform = platform.String()
	if opts.Append {
		return c.addToIndex(ctx, ref, platform, res)
	}
	res.ReplacedIndex = held
	return res, nil
}

// importImage builds the image, or finds an identical one, and writes it
// to ref, or with opts.Append by digest to ref's repository.
func (c *Client) importImage(ctx context.Context, ref name.Tag, disk Disk, src Source, opts ImportOptions) (*api.ImportResult, error) {
	if src.DigestDeferred() {
		return c.importWhileHashing(ctx, ref, disk, src, opts)
	}
	digest, err := src.WaitDigest(ctx)
	if err != nil {
		return nil, err
	}
	desc := disk.Describe()
	key := buildKey(digest, desc, opts)
	if res, err := c.findExisting(ctx, ref, key, digest, desc, opts.Append); err != nil || res != nil {
		return res, err
	}
	upload := knownKey(key)
	if name := src.UploadName(); name != "" {
		upload = knownKey(uploadNameKey(name, desc, opts))
	}
	b, err := c.build(ctx, ref, upload, disk, opts)
	if err != nil {
		return nil, err
	}
	return c.publish(ctx, ref, key, digest, desc, opts, b)
}

// importWhileHashing builds the layer while src's digest is computed, and
// stops the build when the digest names an image that exists.
func (c *Client) importWhileHashing(ctx context.Context, ref name.Tag, disk Disk, src Source, opts ImportOptions) (*api.ImportResult, error) {
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
		res, err := c.findExisting(buildCtx, ref, key, d, desc, opts.Append)
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
	b, buildErr := c.build(buildCtx, ref, later, disk, opts)
	if buildErr != nil && !errors.Is(context.Cause(buildCtx), errFoundExisting) {
		if cause := context.Cause(buildCtx); cause != nil {
			if errors.Is(buildErr, ErrResumable) {
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
	return c.publish(ctx, ref, buildKey(f.digest, desc, opts), f.digest, desc, opts, b)
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
func (c *Client) findExisting(ctx context.Context, ref name.Tag, key, sourceDigest string, desc containerdisk.Description, byDigest bool) (*api.ImportResult, error) {
	for _, rec := range c.cache.lookupBuilds(key, ref.RegistryStr(), ref.RepositoryStr()) {
		result := newResult(ref, sourceDigest, desc)
		found, err := c.reuseBuild(ctx, ref, rec, result, byDigest)
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		if err != nil {
			c.opts.logger.Debug("reusing an earlier build failed; building", "repository", rec.Repository, "digest", rec.Digest, "error", err)
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
	upload    string // the upload's key, whose record publish forgets; "" for none
}

// build validates the disk, then builds and uploads the layer. key names
// the upload for resuming, possibly only later. A layer that an earlier run
// committed under the same key, and that the registry still holds, is not
// built again (the run was stopped before its manifest).
func (c *Client) build(ctx context.Context, ref name.Tag, key *uploadKey, disk Disk, opts ImportOptions) (built, error) {
	if b, ok := c.committedLayer(ctx, ref.Context(), key.get()); ok {
		c.opts.logger.Info("the layer was uploaded by an interrupted run; publishing it", "reference", ref.String(), "digest", b.layer.Digest)
		return b, nil
	}
	// Validate the whole disk before anything is sent: an invalid L2
	// table is refused with nothing uploaded.
	allocated, err := disk.Prepare(ctx)
	if err != nil {
		return built{}, err
	}
	layer, sent, err := c.pushLayer(ctx, ref.Context(), key, disk, opts)
	if errors.Is(err, errUploadLost) {
		c.opts.logger.Info("upload session lost; sending the layer again", "reference", ref.String(), "error", err)
		var again int64
		layer, again, err = c.pushLayer(ctx, ref.Context(), key, disk, opts)
		sent += again
	}
	b := built{layer: layer, sent: sent, allocated: allocated, upload: key.get()}
	if err == nil {
		c.rememberCommitted(ref.Context(), b)
	}
	return b, err
}

// publish pushes the config and the manifest, which writes ref (with
// opts.Append, the manifest goes to ref's repository by digest).
func (c *Client) publish(ctx context.Context, ref name.Tag, key, sourceDigest string, desc containerdisk.Description, opts ImportOptions, b built) (*api.ImportResult, error) {
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
	configDesc, err := c.pushSmallBlob(ctx, ref.Context(), ocispec.MediaTypeImageConfig, img.Config)
	if err != nil {
		return nil, err
	}
	manifest := img.Manifest
	// Blobs are committed; now the manifest, which writes the tag.
	manifestDigest := img.Digest
	var where name.Reference = ref
	if opts.Append {
		where = ref.Context().Digest(manifestDigest)
	}
	if err := c.putManifest(ctx, where, manifest, types.OCIManifestSchema1); err != nil {
		return nil, err
	}
	c.forgetCommitted(ref.Context(), b.upload)
	result := newResult(ref, sourceDigest, desc)
	result.LayerSize, result.UploadedBytes = b.layer.Size, b.sent
	result.Digest = manifestDigest
	result.Pinned = ref.Context().Digest(result.Digest).String()
	c.cache.rememberBuild(buildRecord{Key: key, Registry: ref.RegistryStr(), Repository: ref.RepositoryStr(), Digest: result.Digest,
		Config: configDesc.Digest.String(), Layer: b.layer.Digest, LayerSize: b.layer.Size})
	c.opts.logger.Info("imported", "reference", ref.String(), "digest", result.Digest, "bytes", b.layer.Size)
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
func (c *Client) reuseBuild(ctx context.Context, ref name.Tag, rec buildRecord, result *api.ImportResult, byDigest bool) (bool, error) {
	from, err := name.NewDigest(rec.Registry+"/"+rec.Repository+"@"+rec.Digest, c.nameOptions()...)
	if err != nil {
		return false, err
	}
	manifest, ok, err := c.checkBuild(ctx, from, rec)
	if err != nil || !ok {
		if err == nil {
			c.cache.forgetBuild(rec)
		}
		return false, err
	}
	switch {
	case rec.Repository == ref.RepositoryStr() && byDigest:
		// checkBuild found it there.
	case rec.Repository == ref.RepositoryStr():
		err = c.putManifest(ctx, ref, manifest, types.OCIManifestSchema1)
	case byDigest:
		_, err = c.Copy(ctx, from, ref.Context().Digest(rec.Digest), CopyOptions{})
	default:
		_, err = c.Copy(ctx, from, ref, CopyOptions{})
	}
	if err != nil {
		var terr *transport.Error
		if errors.As(err, &terr) && terr.StatusCode == http.StatusBadRequest {
			return false, nil // a blob went in the meantime: build
		}
		return false, err
	}
	rec.Repository = ref.RepositoryStr()
	c.cache.rememberBuild(rec)
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
func (c *Client) checkBuild(ctx context.Context, pinned name.Digest, rec buildRecord) (manifest []byte, ok bool, err error) {
	ropts, err := c.remoteOptions(ctx, pinned.Registry)
	if err != nil {
		return nil, false, err
	}
	// One puller: the manifest and the blob checks share its session.
	puller, err := remote.NewPuller(ropts...)
	if err != nil {
		return nil, false, err
	}
	desc, err := puller.Get(ctx, pinned)
	var terr *transport.Error
	if errors.As(err, &terr) && terr.StatusCode == http.StatusNotFound {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("fetching %s: %w", pinned, err)
	}
	if desc.Digest.String() != rec.Digest {
		return nil, false, fmt.Errorf("%s answered with manifest %s", pinned, desc.Digest)
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(desc.Manifest, &m); err != nil || len(m.Layers) != 1 ||
		m.Config.Digest.String() != rec.Config || m.Layers[0].Digest.String() != rec.Layer ||
		m.Layers[0].Size != rec.LayerSize || m.Annotations[api.AnnotationBuildKey] != rec.Key {
		return nil, false, nil
	}
	for _, d := range []string{rec.Config, rec.Layer} {
		blob, err := puller.Layer(ctx, pinned.Context().Digest(d))
		if err != nil {
			return nil, false, err
		}
		if exists, err := partial.Exists(blob); err != nil || !exists {
			return nil, false, err
		}
	}
	return desc.Manifest, true, nil
}

// pushLayer builds the layer and streams it into a resumable upload.
// It returns the layer and how many bytes this run sent.
func (c *Client) pushLayer(ctx context.Context, repo name.Repository, key *uploadKey, disk Disk, opts ImportOptions) (containerdisk.LayerInfo, int64, error) {
	up, err := c.startUpload(ctx, repo, key)
	if err != nil {
		return containerdisk.LayerInfo{}, 0, err
	}
	up.run(ctx)
	layer, err := disk.WriteLayer(ctx, up, opts.Progress)
	if err == nil {
		err = up.finish()
	} else {
		up.abort()
	}
	if err == nil {
		err = up.commit(ctx, layer.Digest)
	}
	if err != nil {
		if containerdisk.Rejected(err) || errors.Is(context.Cause(ctx), errFoundExisting) {
			// Rejected or not needed: its bytes must not stay on the registry.
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			up.cancel(cctx)
			cancel()
			return containerdisk.LayerInfo{}, up.sent, err
		}
		// Interrupted or failed: the session stays, for a later run.
		if !errors.Is(err, errUploadLost) && up.saveState() {
			err = &resumableError{err}
		}
		return containerdisk.LayerInfo{}, up.sent, err
	}
	c.opts.logger.Debug("layer uploaded", "digest", layer.Digest, "bytes", layer.Size, "sent", up.sent, "resent", up.resent)
	return layer, up.sent, nil
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

// rawManifest lets go-containerregistry put manifest bytes as they are.
type rawManifest struct {
	b  []byte
	mt types.MediaType
}

func (m rawManifest) RawManifest() ([]byte, error)        { return m.b, nil }
func (m rawManifest) MediaType() (types.MediaType, error) { return m.mt, nil }

// putManifest puts manifest, of media type mt, at ref: a tag, or a digest
// (then the manifest's own).
func (c *Client) putManifest(ctx context.Context, ref name.Reference, manifest []byte, mt types.MediaType) error {
	ropts, err := c.remoteOptions(ctx, ref.Context().Registry)
	if err != nil {
		return err
	}
	if err := remote.Put(ref, rawManifest{manifest, mt}, ropts...); err != nil {
		return fmt.Errorf("pushing the manifest to %s: %w", ref, err)
	}
	return nil
}
