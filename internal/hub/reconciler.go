package hub

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/imagepipe/imagepipe/internal/cdi"
	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
)

// Defaults of the Reconciler's bounds.
const (
	DefaultKeep        = 2
	DefaultMaxAttempts = 5
	DefaultRetryDelay  = 30 * time.Second
	// maxPodRestarts is how many restarts of CDI's importer pod count as
	// one failed attempt: CDI itself retries forever.
	maxPodRestarts = 3
	// importingRecheck is how often an import in progress is looked at
	// even without a DataVolume event.
	importingRecheck = 30 * time.Second
	// servedRecheck is how often a served image's verdict is read again
	// without an event: a verdict refused since, or signed by a key no
	// longer trusted, withdraws the image within it.
	servedRecheck = 15 * time.Minute
	// replacedRecheck is how soon a BaseImage whose import was deleted to
	// be replaced is looked at again: the new DataVolume, of the same
	// name, is created once the old one is gone.
	replacedRecheck = time.Second
	// busyRecheck is how soon a BaseImage is looked at again when a write
	// met a newer copy (a conflict), or after its imports start over.
	busyRecheck = 250 * time.Millisecond
)

// Reconciler drives each BaseImage to a DataSource serving its digest:
// revalidate the image, create a digest-pinned DataVolume, switch the
// DataSource once the import succeeded, and delete imports beyond the
// retention. Every write is preceded by a comparison, so a BaseImage that
// is already where it should be costs no write.
type Reconciler struct {
	Client client.Client
	// APIReader reads without the cache; it confirms a BaseImage is
	// current before an import is started. Nil means Client.
	APIReader client.Reader
	Registry  name.Registry
	// Verdicts finds the gate's verdicts: the only ground for an import.
	Verdicts Verdicts
	// StorageClass is the class imports use; empty means the cluster's default.
	StorageClass string
	// Architecture is the hub's CPU architecture: of an image verified for
	// several platforms, the canonical image for it is imported, and an
	// image verified for none is rejected. Empty means amd64.
	Architecture string
	// Preferences is the table of the preferences an image without a
	// declared one is given from the OS the gate found; nil means the
	// built-in table (BuiltinPreferences).
	Preferences *Preferences
	// PullMethod is CDI's registry pull method; empty means pod.
	PullMethod cdiv1.RegistryPullMethod
	// TenantCredentials, when set, gives each tenant's own registry
	// credential (one that reads only TENANT/*), copied into that tenant's
	// namespace as the Secret cdi.PullSecretName for CDI's importer while
	// a BaseImage's import is started or followed. The syncer's own
	// credential is never copied. Nil means imports carry no pull secret
	// (a public registry, or CDI's node pull method).
	TenantCredentials TenantCredentials
	// CA, when set, is the registry's CA bundle (PEM), copied into each
	// tenant namespace as the ConfigMap cdi.CAConfigMapName, as
	// TenantCredentials' Secret is.
	CA []byte
	// Keep is how many successful imports stay per BaseImage unless its
	// spec says otherwise; 0 means DefaultKeep.
	Keep int32
	// OnDelete is the policy when a tag leaves the registry, unless the
	// BaseImage's spec says otherwise; empty means retain.
	OnDelete v1alpha1.DeletionPolicy
	// HoldUnknownGuests imports only images whose verdict names the
	// operating system the gate found in the disk; the others are
	// refused on this hub with reject.UnknownGuest. False imports them.
	HoldUnknownGuests bool
	// RequireBoot imports only images whose verdict says the gate's boot
	// check saw them boot; others are refused on this hub with
	// reject.NotBooted.
	RequireBoot bool
	// MaxAttempts bounds the imports tried for one digest; 0 means DefaultMaxAttempts.
	MaxAttempts int32
	// RetryDelay is the wait after the first failed import, doubling after
	// each further one up to 10 min; 0 means DefaultRetryDelay.
	RetryDelay time.Duration
	Metrics    *Metrics
	// Recorder records Kubernetes Events on BaseImages for rejections,
	// failed import attempts that are retried, and BaseImages turning
	// Failed (events.go). Nil records none.
	Recorder record.EventRecorder
	// Now is the clock; nil means time.Now.
	Now func() time.Time

	wake    chan event.GenericEvent // Wake's requests, made by SetupWithManager
	elected <-chan struct{}         // closed once this replica leads
	// queue is the controller's work queue, once it started (Backlog).
	queue atomic.Pointer[workqueue.TypedRateLimitingInterface[reconcile.Request]]
}

// Backlog is how many BaseImages wait in the controller's queue to be
// looked at now (those waiting for a later recheck are not counted).
func (r *Reconciler) Backlog() int {
	if q := r.queue.Load(); q != nil {
		return (*q).Len()
	}
	return 0
}

var _ reconcile.Reconciler = (*Reconciler)(nil)

// SetupWithManager registers the reconciler with workers concurrent
// reconciles. It watches BaseImages (spec and annotation changes, not its
// own status writes), the DataVolumes it created, and what Wake asks for.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager, workers int) error {
	r.wake, r.elected = make(chan event.GenericEvent, wakeBuffer), mgr.Elected()
	dvToBaseImage := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		bi := o.GetLabels()[cdi.LabelBaseImage]
		if bi == "" {
			return nil
		}
		return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: o.GetNamespace(), Name: bi}}}
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("baseimage").
		For(&v1alpha1.BaseImage{}, builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{}))).
		Watches(&cdiv1.DataVolume{}, dvToBaseImage).
		WatchesRawSource(source.Channel(r.wake, &handler.EnqueueRequestForObject{})).
		WithOptions(controller.Options{
			MaxConcurrentReconciles: max(workers, 1),
			RateLimiter:             newRateLimiter(),
			NewQueue: func(name string, rl workqueue.TypedRateLimiter[reconcile.Request]) workqueue.TypedRateLimitingInterface[reconcile.Request] {
				q := workqueue.NewTypedRateLimitingQueueWithConfig(rl, workqueue.TypedRateLimitingQueueConfig[reconcile.Request]{Name: name})
				r.queue.Store(&q)
				return q
			},
		}).
		Complete(r)
}

// Requeues after an error wait requeueBase, doubling per BaseImage up to
// requeueMax: the first looks come soon, and a registry or API server
// that stays unavailable is asked less and less often, so that thousands
// of BaseImages never make a storm of requests.
const (
	requeueBase = 50 * time.Millisecond
	requeueMax  = 5 * time.Minute
)

// newRateLimiter is the controller's per-BaseImage requeue backoff.
func newRateLimiter() workqueue.TypedRateLimiter[reconcile.Request] {
	return workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](requeueBase, requeueMax)
}

// wakeBuffer bounds the BaseImages Wake may have waiting for the
// controller's queue; beyond it a wake is dropped, and the BaseImage's
// recheck finds the verdict.
const wakeBuffer = 1024

// Wake has the BaseImages waiting for a verdict on subject looked at
// again at once, rather than at their next recheck: something (the gate's
// verdict, a tenant's signature) was just attached to it. referrer, when
// set, is the attached manifest the registry's event named, as read by its
// digest, which the look-ups read whether or not the registry lists it
// yet, without fetching it again. On the
// leader, any look-up of the subject's verdict in flight is forgotten,
// since it may have missed the attachment, and the BaseImages are queued.
// Another replica, whose reconciler does not run, stamps them with
// AnnotationAttachedAt instead, which the leader's watch sees.
func (r *Reconciler) Wake(ctx context.Context, subject name.Digest, waiting []client.ObjectKey, referrer *registry.RawManifest) error {
	if !r.leading() {
		stamp := r.now().UTC().Format(time.RFC3339Nano)
		for _, key := range waiting {
			bi := &v1alpha1.BaseImage{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
			patch := client.RawPatch(types.MergePatchType, fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q}}}`, v1alpha1.AnnotationAttachedAt, stamp))
			if err := r.Client.Patch(ctx, bi, patch); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("stamping BaseImage %s for the leader: %w", key, err)
			}
		}
		return nil
	}
	if referrer != nil {
		r.Verdicts.Expect(subject, referrer)
	}
	nudge := func() {
		r.Verdicts.Forget(subject)
		for _, key := range waiting {
			bi := &v1alpha1.BaseImage{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
			select {
			case r.wake <- event.GenericEvent{Object: bi}:
			default:
			}
		}
	}
	nudge()
	if referrer != nil {
		return nil // the look-ups read it by digest
	}
	// distribution announces a tag push before the tag points at the new
	// manifest, so the first look may still find the old referrers tag;
	// it points there tens of milliseconds later, so the next looks come
	// soon, then spread out for a registry under load.
	for _, after := range wakeAgain {
		time.AfterFunc(after, nudge)
	}
	return nil
}

// wakeAgain are when Wake looks again after the first.
var wakeAgain = []time.Duration{50 * time.Millisecond, 150 * time.Millisecond, 400 * time.Millisecond, time.Second}

// leading reports whether this replica's reconciler runs: it leads, or
// leader election is off.
func (r *Reconciler) leading() bool {
	if r.elected == nil {
		return false
	}
	select {
	case <-r.elected:
		return true
	default:
		return false
	}
}

// Reconcile implements reconcile.Reconciler: it reads the BaseImage, lets
// reconcile move it one step on (import.go, serve.go, gc.go record what
// they did in the status in memory), and writes the status here, the one
// place it is written, only when it changed.
//
// A step that must start from the newest BaseImage (an import, a deletion,
// the status write) and finds the cached copy behind the API server's goes
// on at once from the API server's copy, rather than waiting for the cache:
// under load the cache can lag by a second, and each requeue through the
// backoff waits twice as long as the one before.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var bi v1alpha1.BaseImage
	if err := r.Client.Get(ctx, req.NamespacedName, &bi); err != nil {
		if apierrors.IsNotFound(err) {
			r.Metrics.phase(req.NamespacedName, "")
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, err
	}
	res, err := r.step(ctx, &bi)
	var stale *staleError
	if errors.As(err, &stale) {
		res, err = r.step(ctx, stale.fresh)
		if errors.As(err, &stale) {
			// Written again meanwhile: a busy object, looked at again later.
			return reconcile.Result{RequeueAfter: busyRecheck}, nil
		}
	}
	// An error is not logged here: controller-runtime logs it with the
	// request and retries with backoff.
	return res, err
}

// step reconciles bi once and writes its status. It returns a *staleError
// when bi turned out to be older than the API server's copy, and then
// writes nothing.
func (r *Reconciler) step(ctx context.Context, bi *v1alpha1.BaseImage) (reconcile.Result, error) {
	key := client.ObjectKeyFromObject(bi)
	if !bi.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, nil
	}
	before := bi.Status.DeepCopy()
	res, gone, err := r.reconcile(ctx, bi)
	if stale := (*staleError)(nil); errors.As(err, &stale) {
		return res, err
	}
	if gone {
		r.Metrics.phase(key, "")
		return res, err
	}
	bi.Status.ObservedGeneration = bi.Generation
	if !equality.Semantic.DeepEqual(before, &bi.Status) {
		uerr := r.Client.Status().Update(ctx, bi)
		if apierrors.IsConflict(uerr) && err == nil {
			if cerr := r.current(ctx, bi); cerr != nil {
				return reconcile.Result{}, cerr
			}
			return reconcile.Result{RequeueAfter: busyRecheck}, nil
		}
		if uerr != nil {
			return res, errors.Join(err, fmt.Errorf("updating the status of BaseImage %s: %w", key, uerr))
		}
		r.recordEvents(bi, before)
	}
	r.Metrics.phase(key, bi.Status.Phase)
	return res, err
}

// reconcile moves bi one step on and records the outcome in bi.Status.
// gone reports that the BaseImage was deleted by the deletion policy.
func (r *Reconciler) reconcile(ctx context.Context, bi *v1alpha1.BaseImage) (res reconcile.Result, gone bool, err error) {
	if err := r.checkNamespaceOwner(ctx, bi); err != nil {
		return reconcile.Result{}, false, err
	}
	image := cdi.ImageName(r.repoPath(bi))
	if want := cdi.BaseImageName(r.repoPath(bi), bi.Spec.Tag); bi.Name != want {
		// Made by hand: the syncer manages only the BaseImages it names,
		// and leaves this one alone.
		msg := fmt.Sprintf("this BaseImage's name is not the one image-syncer derives for %s:%s (%s); image-syncer leaves it alone. Delete it: image-syncer makes %s by itself",
			bi.Spec.Repository, bi.Spec.Tag, want, want)
		r.condition(bi, v1alpha1.ConditionProgressing, false, "UnexpectedName", msg)
		// Failing closed: whatever its status says it serves was not
		// checked by this syncer, so its DataSource serves nothing.
		if served := bi.Status.ImportedDigest; served != "" {
			return reconcile.Result{}, false, r.withdraw(ctx, bi, served, false, msg)
		}
		r.condition(bi, v1alpha1.ConditionReady, false, "UnexpectedName", msg)
		return reconcile.Result{}, false, nil
	}
	if _, removed := bi.Annotations[v1alpha1.AnnotationRemoved]; removed {
		if r.onDelete(bi) == v1alpha1.DeletionDelete {
			// A push may have cleared the mark since the cache saw it.
			if err := r.current(ctx, bi); err != nil {
				return reconcile.Result{}, false, err
			}
			return reconcile.Result{}, true, r.deleteAll(ctx, bi, image)
		}
		bi.Status.Phase = v1alpha1.PhaseDeleted
		bi.Status.Progress = ""
		r.condition(bi, v1alpha1.ConditionProgressing, false, "RemovedFromRegistry",
			"the tag is gone from the registry; the current import is retained (deletion policy retain)")
		if err := r.checkRetained(ctx, bi, image); err != nil {
			return reconcile.Result{}, false, err
		}
		return reconcile.Result{}, false, r.collect(ctx, bi, image, "")
	}
	digest := bi.Spec.Digest
	if digest == "" {
		bi.Status.Phase = v1alpha1.PhasePending
		return reconcile.Result{}, false, nil
	}
	// The verdicts are read on every look (a minute's memory makes that
	// cheap), so that nothing a BaseImage's status says, whoever wrote it,
	// is ground for an import or for serving a volume.
	adm, err := r.admissionOf(ctx, bi, digest)
	if err != nil {
		r.condition(bi, v1alpha1.ConditionProgressing, true, "RegistryUnavailable", "reading the gate's verdict: "+err.Error())
		return reconcile.Result{}, false, err
	}
	wait := r.admit(ctx, bi, digest, adm)
	if err := r.checkServed(ctx, bi, image, digest, adm); err != nil {
		return reconcile.Result{}, false, err
	}
	if wait > 0 {
		return reconcile.Result{RequeueAfter: wait}, false, nil
	}
	if _, retry := bi.Annotations[v1alpha1.AnnotationRetry]; retry {
		return r.retry(ctx, bi)
	}
	if adm.image == nil {
		bi.Status.Phase = v1alpha1.PhaseRejected
		return reconcile.Result{}, false, r.collect(ctx, bi, image, "")
	}

	im, credential, err := r.importOf(ctx, bi, image, digest)
	im.Guest = adm.image.Guest // the DataSource says what the gate found in the disk
	if err == nil && bi.Status.ImportedDigest != digest {
		// Only an import reads the copies: a served digest costs no
		// request for them.
		err = r.copyForImport(ctx, bi.Namespace, credential)
	}
	if err != nil {
		reason := "StorageUnavailable"
		if errors.Is(err, ErrNoTenantCredential) {
			reason = "NoTenantCredential"
		}
		r.condition(bi, v1alpha1.ConditionProgressing, false, reason, err.Error())
		return reconcile.Result{}, false, err
	}
	dvName := cdi.DataVolumeName(image, digest)
	if bi.Status.ImportedDigest == digest {
		return reconcile.Result{RequeueAfter: servedRecheck}, false, r.serve(ctx, bi, im)
	}
	res, err = r.importDigest(ctx, bi, im, dvName)
	if err != nil {
		return res, false, err
	}
	if bi.Status.ImportedDigest == digest { // it just succeeded
		return reconcile.Result{RequeueAfter: servedRecheck}, false, r.serve(ctx, bi, im)
	}
	return res, false, r.collect(ctx, bi, image, dvName)
}

// current returns nil when bi is the newest version of the object, and
// otherwise a *staleError carrying the newest.
func (r *Reconciler) current(ctx context.Context, bi *v1alpha1.BaseImage) error {
	reader := r.APIReader
	if reader == nil {
		return nil // the client reads the API server itself
	}
	fresh := &v1alpha1.BaseImage{}
	if err := reader.Get(ctx, client.ObjectKeyFromObject(bi), fresh); err != nil {
		return fmt.Errorf("reading BaseImage %s: %w", client.ObjectKeyFromObject(bi), err)
	}
	if fresh.ResourceVersion == bi.ResourceVersion {
		return nil
	}
	return &staleError{fresh: fresh}
}

// staleError reports that a BaseImage read from the cache is older than
// fresh, the API server's copy.
type staleError struct{ fresh *v1alpha1.BaseImage }

func (e *staleError) Error() string {
	return fmt.Sprintf("BaseImage %s/%s changed since the cache read it", e.fresh.Namespace, e.fresh.Name)
}

// conflict reports on bi that an object it needs belongs to someone else,
// and returns the error that has the BaseImage looked at again later.
func (r *Reconciler) conflict(bi *v1alpha1.BaseImage, c *ConflictError) error {
	bi.Status.Phase = v1alpha1.PhaseFailed
	msg := c.Error() + "; delete or rename it for this BaseImage to be served"
	r.condition(bi, v1alpha1.ConditionReady, false, "Conflict", msg)
	r.condition(bi, v1alpha1.ConditionProgressing, false, "Conflict", msg)
	return c
}

func (r *Reconciler) condition(bi *v1alpha1.BaseImage, typ string, status bool, reason, msg string) {
	s := metav1.ConditionFalse
	if status {
		s = metav1.ConditionTrue
	}
	meta.SetStatusCondition(&bi.Status.Conditions, metav1.Condition{
		Type: typ, Status: s, Reason: reason, Message: msg, ObservedGeneration: bi.Generation,
	})
}

// repoPath is the BaseImage's repository without the registry host.
func (r *Reconciler) repoPath(bi *v1alpha1.BaseImage) string {
	return strings.TrimPrefix(bi.Spec.Repository, r.Registry.RegistryStr()+"/")
}

func (r *Reconciler) keep(bi *v1alpha1.BaseImage) int32 {
	if ret := bi.Spec.Retention; ret != nil && ret.Keep > 0 {
		return ret.Keep
	}
	if r.Keep > 0 {
		return r.Keep
	}
	return DefaultKeep
}

func (r *Reconciler) onDelete(bi *v1alpha1.BaseImage) v1alpha1.DeletionPolicy {
	if ret := bi.Spec.Retention; ret != nil && ret.OnDelete != "" {
		return ret.OnDelete
	}
	if r.OnDelete != "" {
		return r.OnDelete
	}
	return v1alpha1.DeletionRetain
}

func (r *Reconciler) maxAttempts() int32 {
	if r.MaxAttempts > 0 {
		return r.MaxAttempts
	}
	return DefaultMaxAttempts
}

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}
