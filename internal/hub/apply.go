package hub

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/imagepipe/imagepipe/internal/cdi"
	"github.com/imagepipe/imagepipe/internal/intake"
	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/pkg/api"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
)

// Resolver looks a tag up directly in the registry; *registry.Client
// implements it. found is false only when the registry answered that the
// tag does not exist.
type Resolver interface {
	Resolve(ctx context.Context, ref name.Tag) (digest string, found bool, err error)
}

// Applier turns registry events into BaseImages on one hub: a push creates
// or updates the BaseImage of the tag, a confirmed delete marks it removed
// so that the reconciler applies the deletion policy. It writes only when
// something changed, so replayed or polled events cost no Kubernetes
// writes. Any replica may run it; the API server's optimistic concurrency
// settles races.
type Applier struct {
	Client client.Client
	// APIReader reads the API server itself, for when Client's cache lags
	// (a create refused because the object exists); nil means Client.
	APIReader client.Reader
	Registry  name.Registry
	Resolver  Resolver
	Tenancy   *Tenancy
	Logger    *slog.Logger
	// Wake, when set, is told of the BaseImages waiting for a verdict on
	// a digest that something may just have been attached to (the gate's
	// verdict, a tenant's signature), with the attached verdict's manifest
	// when the event named it; the Reconciler's Wake.
	Wake func(ctx context.Context, subject name.Digest, waiting []client.ObjectKey, referrer *registry.RawManifest) error
	// Manifests reads a manifest pushed by digest, to learn which digest
	// it is attached to; nil wakes every waiting BaseImage of the
	// repository instead. *registry.Client implements it.
	Manifests ManifestReader
	// MaxImagesPerTenant bounds the BaseImages of one tenant on this hub:
	// a tag pushed beyond it gets none (logged), since tags cost a tenant
	// one small manifest each and cost every hub an object, a reconcile
	// and a status write. 0 means no bound.
	MaxImagesPerTenant int
	// Now is the clock; nil means time.Now.
	Now func() time.Time

	mu     sync.Mutex
	counts map[string]imageCount // by tenant, for MaxImagesPerTenant
}

// DefaultMaxImagesPerTenant is image-syncer's default bound on one
// tenant's BaseImages per hub.
const DefaultMaxImagesPerTenant = 1000

// Apply handles one event. It returns nil for events about tenants this
// hub does not serve or whose namespace belongs to another tenant (logged;
// see Tenancy), and an error when the event must be retried (the registry
// could not confirm a delete, the API server failed).
func (a *Applier) Apply(ctx context.Context, e intake.Event) error {
	tenant, ns, err := a.Tenancy.Namespace(e.Repository)
	if err != nil {
		a.logger().Debug("event ignored", "repository", e.Repository, "reason", err)
		return nil
	}
	if err := a.Tenancy.claim(ctx, a.Client, tenant, ns); err != nil {
		if taken := (*namespaceTakenError)(nil); errors.As(err, &taken) {
			a.logger().Warn("event not applied: the namespace belongs to another tenant", "repository", e.Repository, "tag", e.Tag,
				"tenant", tenant, "namespace", ns, "owner", taken.Owner)
			return nil
		}
		return err
	}
	if api.IsAttachmentTag(e.Tag) {
		// Not an image: an attachment to the digest the tag names.
		if e.Action != intake.ActionPush {
			return nil
		}
		return a.wakeWaiting(ctx, tenant, ns, e.Repository, "sha256:"+strings.TrimPrefix(e.Tag, "sha256-")[:64], nil)
	}
	if e.Tag == "" {
		if e.Action == intake.ActionPush {
			// No tag to sync; perhaps a referrer (the gate's verdict),
			// whose subject the event does not name.
			return a.wakeForReferrer(ctx, tenant, ns, e)
		}
		return a.applyDigest(ctx, tenant, ns, e)
	}
	digest := e.Digest
	if e.Action == intake.ActionDelete || digest == "" {
		// A delete must be confirmed: the tag may have been pushed again
		// since. A push without a digest (Quay) is resolved. The BaseImage
		// is read before the registry is asked, and only that version is
		// marked removed: a push applied meanwhile makes the mark fail
		// (a conflict, retried) instead of marking the new digest removed.
		key := client.ObjectKey{Namespace: ns, Name: cdi.BaseImageName(e.Repository, e.Tag)}
		var before v1alpha1.BaseImage
		err := a.Client.Get(ctx, key, &before)
		exists := err == nil
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("reading BaseImage %s: %w", key, err)
		}
		got, found, err := a.Resolver.Resolve(ctx, a.Registry.Repo(e.Repository).Tag(e.Tag))
		if err != nil {
			return fmt.Errorf("confirming %s:%s: %w", e.Repository, e.Tag, err)
		}
		if !found {
			if !exists {
				return nil
			}
			return a.markRemoved(ctx, &before, e.Repository, e.Tag)
		}
		digest = got
	}
	return a.upsert(ctx, tenant, ns, e.Repository, e.Tag, digest)
}

// applyDigest handles an event naming only a digest (distribution announces
// a manifest delete that way): every tag of the image last seen at that
// digest is confirmed against the registry.
func (a *Applier) applyDigest(ctx context.Context, tenant, ns string, e intake.Event) error {
	var list v1alpha1.BaseImageList
	if err := a.Client.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{cdi.LabelImage: cdi.ImageName(e.Repository), cdi.LabelTenant: tenant}); err != nil {
		return fmt.Errorf("listing the BaseImages of %s: %w", e.Repository, err)
	}
	repository := a.repository(e.Repository)
	for _, bi := range list.Items {
		if bi.Spec.Digest != e.Digest || bi.Spec.Repository != repository {
			continue
		}
		if err := a.Apply(ctx, intake.Event{Action: intake.ActionDelete, Repository: e.Repository, Tag: bi.Spec.Tag, Source: e.Source}); err != nil {
			return err
		}
	}
	return nil
}

// ManifestReader fetches a manifest; *registry.Client implements it.
type ManifestReader interface {
	FetchManifest(ctx context.Context, ref name.Reference) (*registry.RawManifest, error)
}

// wakeForReferrer handles the push of a manifest by digest. A verdict
// attached to a digest wakes the BaseImages waiting on that digest, with
// the verdict's manifest for their look-ups; another referrer wakes those
// of its subject, and a manifest attached to nothing wakes none. When the
// manifest cannot be read (no Manifests, the registry failed), every
// waiting BaseImage of the repository is woken.
func (a *Applier) wakeForReferrer(ctx context.Context, tenant, ns string, e intake.Event) error {
	if a.Manifests == nil || e.Digest == "" {
		return a.wakeWaiting(ctx, tenant, ns, e.Repository, "", nil)
	}
	ref := a.Registry.Repo(e.Repository).Digest(e.Digest)
	raw, err := a.Manifests.FetchManifest(ctx, ref)
	if err != nil {
		a.logger().Debug("pushed manifest not read; waking every waiting image of the repository", "manifest", ref.String(), "error", err)
		return a.wakeWaiting(ctx, tenant, ns, e.Repository, "", nil)
	}
	var m struct {
		ArtifactType string `json:"artifactType"`
		Subject      *struct {
			Digest string `json:"digest"`
		} `json:"subject"`
	}
	if json.Unmarshal(raw.Bytes, &m) != nil || m.Subject == nil {
		return nil
	}
	if _, err := v1.NewHash(m.Subject.Digest); err != nil {
		return nil
	}
	var referrer *registry.RawManifest
	if m.ArtifactType == api.VerdictArtifactType {
		referrer = raw
	}
	return a.wakeWaiting(ctx, tenant, ns, e.Repository, m.Subject.Digest, referrer)
}

// wakeWaiting wakes the BaseImages of repo waiting for a verdict on
// subject, or on any digest when subject is "". referrer, when set, is
// the verdict just attached to subject, passed on even when no BaseImage
// waits yet.
func (a *Applier) wakeWaiting(ctx context.Context, tenant, ns, repo, subject string, referrer *registry.RawManifest) error {
	if a.Wake == nil {
		return nil
	}
	var list v1alpha1.BaseImageList
	if err := a.Client.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{cdi.LabelImage: cdi.ImageName(repo), cdi.LabelTenant: tenant}); err != nil {
		return fmt.Errorf("listing the BaseImages of %s: %w", repo, err)
	}
	waiting := map[string][]client.ObjectKey{} // by digest
	repository := a.repository(repo)
	for _, bi := range list.Items {
		d := bi.Spec.Digest
		if bi.Spec.Repository != repository || d == "" || bi.Status.ObservedDigest == d || subject != "" && d != subject {
			continue
		}
		waiting[d] = append(waiting[d], client.ObjectKeyFromObject(&bi))
	}
	if _, ok := waiting[subject]; !ok && referrer != nil {
		// The verdict may come before the BaseImage that will wait for it
		// (the gate verifies while this hub's events queue): its look-ups
		// are told of it all the same.
		waiting[subject] = nil
	}
	for d, keys := range waiting {
		if _, err := v1.NewHash(d); err != nil {
			continue // not a digest this syncer could have looked up
		}
		ref := a.Registry.Repo(repo).Digest(d) // keeps the registry's scheme
		if err := a.Wake(ctx, ref, keys, referrer); err != nil {
			return err
		}
	}
	return nil
}

func (a *Applier) apiReader() client.Reader {
	if a.APIReader != nil {
		return a.APIReader
	}
	return a.Client
}

func (a *Applier) repository(repo string) string { return a.Registry.Repo(repo).String() }

// tenantFull reports whether tenant has MaxImagesPerTenant BaseImages in
// ns, and whether to warn about it: once per count, so that a flood of
// tags is logged once a second, not once per tag. Counting lists the
// tenant's BaseImages in the cache, so a count is kept, with the creates
// since: below the bound for countFor (a first sync creates thousands), at
// the bound for recountAtBound (a flood of new tags is turned away without
// a count each, and a BaseImage deleted makes room soon). Creates by other
// workers meanwhile may let a tenant pass the bound by a few, never by
// many.
func (a *Applier) tenantFull(ctx context.Context, tenant, ns string) (full, warn bool, err error) {
	if a.MaxImagesPerTenant <= 0 {
		return false, false, nil
	}
	a.mu.Lock()
	c, ok := a.counts[tenant]
	if ok {
		age := a.now().Sub(c.at)
		if c.n < a.MaxImagesPerTenant && age < countFor {
			a.mu.Unlock()
			return false, false, nil
		}
		if c.n >= a.MaxImagesPerTenant && age < recountAtBound {
			warn, c.warned = !c.warned, true
			a.counts[tenant] = c
			a.mu.Unlock()
			return true, warn, nil
		}
	}
	a.mu.Unlock()
	var list v1alpha1.BaseImageList
	if err := a.Client.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{cdi.LabelTenant: tenant}, client.UnsafeDisableDeepCopy); err != nil {
		return false, false, fmt.Errorf("counting the BaseImages of tenant %s: %w", tenant, err)
	}
	full = len(list.Items) >= a.MaxImagesPerTenant
	a.mu.Lock()
	if a.counts == nil || len(a.counts) >= maxCounted {
		a.counts = map[string]imageCount{}
	}
	a.counts[tenant] = imageCount{n: len(list.Items), at: a.now(), warned: full}
	a.mu.Unlock()
	return full, full, nil // a fresh count at the bound is warned about
}

// created counts a BaseImage just made for tenant in its kept count.
func (a *Applier) created(tenant string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if c, ok := a.counts[tenant]; ok {
		c.n++
		a.counts[tenant] = c
	}
}

// imageCount is a tenant's BaseImages, as counted at a time, and whether
// a tag turned away since has been logged.
type imageCount struct {
	n      int
	at     time.Time
	warned bool
}

// How long a tenant's count of BaseImages is used before it is counted
// again (tenantFull).
const (
	countFor       = 10 * time.Second
	recountAtBound = time.Second
)

// maxCounted bounds the tenants whose counts are kept; past it, all are
// dropped and counted again.
const maxCounted = 4096

// upsert makes the BaseImage of repo:tag name digest.
func (a *Applier) upsert(ctx context.Context, tenant, ns, repo, tag, digest string) error {
	image := cdi.ImageName(repo)
	key := client.ObjectKey{Namespace: ns, Name: cdi.BaseImageName(repo, tag)}
	var bi v1alpha1.BaseImage
	err := a.Client.Get(ctx, key, &bi)
	if apierrors.IsNotFound(err) {
		full, warn, cerr := a.tenantFull(ctx, tenant, ns)
		if cerr != nil {
			return cerr
		}
		if full {
			level := slog.LevelDebug
			if warn {
				level = slog.LevelWarn
			}
			a.logger().Log(ctx, level, "event not applied: the tenant has as many BaseImages as this hub allows (--max-images-per-tenant)",
				"repository", repo, "tag", tag, "tenant", tenant, "namespace", ns, "limit", a.MaxImagesPerTenant)
			return nil
		}
		bi = v1alpha1.BaseImage{
			ObjectMeta: metav1.ObjectMeta{
				Name: key.Name, Namespace: ns,
				Labels: map[string]string{
					cdi.LabelManagedBy: cdi.ManagedByValue, cdi.LabelTenant: tenant, cdi.LabelImage: image, cdi.LabelTag: cdi.LabelValue(tag),
				},
				Annotations: map[string]string{v1alpha1.AnnotationSeenAt: a.now().Format(time.RFC3339Nano)},
			},
			Spec: v1alpha1.BaseImageSpec{Tenant: tenant, Repository: a.repository(repo), Tag: tag, Digest: digest},
		}
		err = a.Client.Create(ctx, &bi)
		if err == nil {
			a.created(tenant)
			a.logger().Info("BaseImage created", "baseimage", key, "digest", digest)
			return nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating BaseImage %s: %w", key, err)
		}
		// The cache has not seen it yet (after an API server outage, that
		// can take a minute): the stored object is updated instead.
		bi = v1alpha1.BaseImage{}
		err = a.apiReader().Get(ctx, key, &bi)
	}
	if err != nil {
		return fmt.Errorf("reading BaseImage %s: %w", key, err)
	}
	if bi.Spec.Repository != a.repository(repo) || bi.Spec.Tag != tag {
		// cdi.BaseImageName is injective, so this is a hand-made object (or
		// a hash collision): it is never taken over.
		return fmt.Errorf("BaseImage %s belongs to %s:%s, not %s:%s; it is left as it is", key, bi.Spec.Repository, bi.Spec.Tag, a.repository(repo), tag)
	}
	_, removed := bi.Annotations[v1alpha1.AnnotationRemoved]
	if bi.Spec.Digest == digest && !removed {
		return nil // nothing changed: no write
	}
	bi.Spec.Digest = digest
	delete(bi.Annotations, v1alpha1.AnnotationRemoved)
	if bi.Annotations == nil {
		bi.Annotations = map[string]string{}
	}
	bi.Annotations[v1alpha1.AnnotationSeenAt] = a.now().Format(time.RFC3339Nano)
	if err := a.Client.Update(ctx, &bi); err != nil {
		return fmt.Errorf("updating BaseImage %s: %w", key, err)
	}
	a.logger().Info("BaseImage digest changed", "baseimage", key, "digest", digest)
	return nil
}

// markRemoved records that repo:tag is confirmed gone from the registry,
// on bi as read before the registry was asked. A BaseImage of another
// repository or tag is never marked.
func (a *Applier) markRemoved(ctx context.Context, bi *v1alpha1.BaseImage, repo, tag string) error {
	key := client.ObjectKeyFromObject(bi)
	if _, ok := bi.Annotations[v1alpha1.AnnotationRemoved]; ok {
		return nil
	}
	if bi.Spec.Repository != a.repository(repo) || bi.Spec.Tag != tag {
		a.logger().Info("delete not applied: the BaseImage of that name is another image's", "baseimage", key,
			"repository", bi.Spec.Repository, "tag", bi.Spec.Tag)
		return nil
	}
	if bi.Annotations == nil {
		bi.Annotations = map[string]string{}
	}
	bi.Annotations[v1alpha1.AnnotationRemoved] = a.now().UTC().Format(time.RFC3339)
	if err := a.Client.Update(ctx, bi); err != nil {
		return fmt.Errorf("marking BaseImage %s removed: %w", key, err)
	}
	a.logger().Info("tag removed from the registry", "baseimage", key)
	return nil
}

func (a *Applier) now() time.Time {
	if a.Now != nil {
		return a.Now()
	}
	return time.Now()
}

func (a *Applier) logger() *slog.Logger {
	if a.Logger != nil {
		return a.Logger
	}
	return slog.New(slog.DiscardHandler)
}
