package hub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/workqueue"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/imagepipe/imagepipe/internal/cdi"
	"github.com/imagepipe/imagepipe/pkg/api"
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
)

// Checker revalidates an image in the registry before it is imported;
// *registry.Client implements it.
type Checker interface {
	CheckContainerDisk(ctx context.Context, ref name.Reference) (*api.ContainerDiskReport, error)
}

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
	Checker   Checker
	// StorageClass is the class imports use; empty means the cluster's default.
	StorageClass string
	// PullMethod is CDI's registry pull method; empty means pod.
	PullMethod cdiv1.RegistryPullMethod
	// TenantCredentials, when set, gives each tenant's own registry
	// credential (one that reads only TENANT/*), copied into that tenant's
	// namespace as the Secret cdi.PullSecretName for CDI's importer. The
	// syncer's own credential is never copied. Nil means imports carry no
	// pull secret (a public registry, or CDI's node pull method).
	TenantCredentials TenantCredentials
	// CA, when set, is the registry's CA bundle (PEM), copied into each
	// tenant namespace as the ConfigMap cdi.CAConfigMapName.
	CA []byte
	// Keep is how many successful imports stay per BaseImage unless its
	// spec says otherwise; 0 means DefaultKeep.
	Keep int32
	// OnDelete is the policy when a tag leaves the registry, unless the
	// BaseImage's spec says otherwise; empty means retain.
	OnDelete v1alpha1.DeletionPolicy
	// MaxAttempts bounds the imports tried for one digest; 0 means DefaultMaxAttempts.
	MaxAttempts int32
	// RetryDelay is the wait after the first failed import, doubling after
	// each further one up to 10 min; 0 means DefaultRetryDelay.
	RetryDelay time.Duration
	Metrics    *Metrics
	Logger     *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time

	// verdicts caches revalidation reports by repository@digest: a digest
	// is immutable, and many tags (or hubs' namespaces) share one.
	verdictsMu sync.Mutex
	verdicts   map[string]*api.ContainerDiskReport
}

// maxVerdicts bounds the revalidation cache; it is emptied when full.
const maxVerdicts = 4096

var _ reconcile.Reconciler = (*Reconciler)(nil)

// SetupWithManager registers the reconciler with workers concurrent
// reconciles. It watches BaseImages (spec and annotation changes, not its
// own status writes) and the DataVolumes it created.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager, workers int) error {
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
		WithOptions(controller.Options{
			MaxConcurrentReconciles: max(workers, 1),
			RateLimiter:             workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](time.Second, 5*time.Minute),
		}).
		Complete(r)
}

// Reconcile implements reconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var bi v1alpha1.BaseImage
	if err := r.Client.Get(ctx, req.NamespacedName, &bi); err != nil {
		if apierrors.IsNotFound(err) {
			r.Metrics.phase(req.NamespacedName, "")
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, err
	}
	if !bi.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, nil
	}
	before := bi.Status.DeepCopy()
	res, gone, err := r.reconcile(ctx, &bi)
	if gone {
		r.Metrics.phase(req.NamespacedName, "")
		return res, err
	}
	bi.Status.ObservedGeneration = bi.Generation
	if !equality.Semantic.DeepEqual(before, &bi.Status) {
		uerr := r.Client.Status().Update(ctx, &bi)
		if apierrors.IsConflict(uerr) && err == nil {
			// A stale cache read: the next run sees the newer object.
			return reconcile.Result{Requeue: true}, nil
		}
		if uerr != nil {
			return res, errors.Join(err, fmt.Errorf("updating the status of BaseImage %s: %w", req.NamespacedName, uerr))
		}
	}
	r.Metrics.phase(req.NamespacedName, bi.Status.Phase)
	if err != nil {
		r.logger().Info("reconcile failed; retrying with backoff", "baseimage", req.NamespacedName, "error", err)
	}
	return res, err
}

// reconcile moves bi one step on and records the outcome in bi.Status.
// gone reports that the BaseImage was deleted by the deletion policy.
func (r *Reconciler) reconcile(ctx context.Context, bi *v1alpha1.BaseImage) (res reconcile.Result, gone bool, err error) {
	image := cdi.ImageName(r.repoPath(bi))
	if want := cdi.BaseImageName(r.repoPath(bi), bi.Spec.Tag); bi.Name != want {
		// Named by an earlier version, or made by hand: the syncer leaves
		// it and everything it made alone (docs/syncer.md, Upgrading).
		msg := fmt.Sprintf("this BaseImage's name is not the one image-syncer derives for %s:%s (%s); the syncer no longer updates it or what it made. Delete it, its DataSource and its DataVolumes (label %s=%s) once %s serves the image",
			bi.Spec.Repository, bi.Spec.Tag, want, cdi.LabelBaseImage, bi.Name, want)
		r.condition(bi, v1alpha1.ConditionReady, false, "LegacyName", msg)
		r.condition(bi, v1alpha1.ConditionProgressing, false, "LegacyName", msg)
		return reconcile.Result{}, false, nil
	}
	if _, removed := bi.Annotations[v1alpha1.AnnotationRemoved]; removed {
		if r.onDelete(bi) == v1alpha1.DeletionDelete {
			// A push may have cleared the mark since the cache saw it.
			if current, err := r.isCurrent(ctx, bi); err != nil || !current {
				return reconcile.Result{Requeue: true}, true, err
			}
			return reconcile.Result{}, true, r.deleteAll(ctx, bi, image)
		}
		bi.Status.Phase = v1alpha1.PhaseDeleted
		bi.Status.Progress = ""
		r.condition(bi, v1alpha1.ConditionProgressing, false, "RemovedFromRegistry",
			"the tag is gone from the registry; the current import is retained (deletion policy retain)")
		return reconcile.Result{}, false, r.collect(ctx, bi, image, "")
	}
	digest := bi.Spec.Digest
	if digest == "" {
		bi.Status.Phase = v1alpha1.PhasePending
		return reconcile.Result{}, false, nil
	}
	if bi.Status.ObservedDigest != digest {
		if err := r.revalidate(ctx, bi, digest); err != nil {
			return reconcile.Result{}, false, err
		}
	}
	if _, retry := bi.Annotations[v1alpha1.AnnotationRetry]; retry {
		return r.retry(ctx, bi)
	}
	if meta.IsStatusConditionTrue(bi.Status.Conditions, v1alpha1.ConditionRejected) {
		bi.Status.Phase = v1alpha1.PhaseRejected
		return reconcile.Result{}, false, r.collect(ctx, bi, image, "")
	}

	im, err := r.importOf(ctx, bi, image, digest)
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
		return reconcile.Result{}, false, r.serve(ctx, bi, im)
	}
	res, err = r.importDigest(ctx, bi, im, dvName)
	if err != nil {
		return res, false, err
	}
	if bi.Status.ImportedDigest == digest { // it just succeeded
		return res, false, r.serve(ctx, bi, im)
	}
	return res, false, r.collect(ctx, bi, image, dvName)
}

// revalidate re-runs the containerDisk checks on the digest, so that an
// image pushed by another client is refused before anything is imported.
func (r *Reconciler) revalidate(ctx context.Context, bi *v1alpha1.BaseImage, digest string) error {
	ref := r.Registry.Repo(r.repoPath(bi)).Digest(digest)
	report, err := r.check(ctx, ref)
	if err != nil {
		r.condition(bi, v1alpha1.ConditionProgressing, true, "RegistryUnavailable", "revalidating the image: "+err.Error())
		return fmt.Errorf("revalidating %s: %w", ref, err)
	}
	st := &bi.Status
	st.ObservedDigest, st.ShortDigest = digest, strings.TrimPrefix(digest, "sha256:")[:12]
	st.Attempts, st.Progress = 0, ""
	st.VirtualSize = report.VirtualSize
	st.Instancetype, st.Preference = envValue(report.Env, api.EnvDefaultInstancetype), envValue(report.Env, api.EnvDefaultPreference)
	if report.Verdict == api.VerdictRejected {
		var reasons, messages []string
		for _, rj := range report.Reasons {
			reasons = append(reasons, rj.Code)
			messages = append(messages, rj.Code+": "+rj.Message)
		}
		r.condition(bi, v1alpha1.ConditionRejected, true, conditionReason(reasons), "the image was refused at revalidation: "+strings.Join(messages, "; "))
		r.condition(bi, v1alpha1.ConditionProgressing, false, "Rejected", "nothing is imported from a rejected image")
		r.logger().Info("image rejected", "image", ref, "reasons", reasons)
		return nil
	}
	r.condition(bi, v1alpha1.ConditionRejected, false, "Validated", "the containerDisk shape and disk header passed revalidation")
	return nil
}

// check revalidates ref once; later BaseImages of the same digest reuse
// the verdict. Errors are not cached.
func (r *Reconciler) check(ctx context.Context, ref name.Digest) (*api.ContainerDiskReport, error) {
	key := ref.String()
	r.verdictsMu.Lock()
	report, ok := r.verdicts[key]
	r.verdictsMu.Unlock()
	if ok {
		return report, nil
	}
	report, err := r.Checker.CheckContainerDisk(ctx, ref)
	if err != nil {
		return nil, err
	}
	r.verdictsMu.Lock()
	if r.verdicts == nil || len(r.verdicts) >= maxVerdicts {
		r.verdicts = map[string]*api.ContainerDiskReport{}
	}
	r.verdicts[key] = report
	r.verdictsMu.Unlock()
	return report, nil
}

// importOf gathers what the DataVolume of digest needs: storage choice,
// registry credentials and CA in the namespace, the image's hints.
func (r *Reconciler) importOf(ctx context.Context, bi *v1alpha1.BaseImage, image, digest string) (cdi.Import, error) {
	st, migratable, reason, err := r.storage(ctx)
	if err != nil {
		return cdi.Import{}, err
	}
	if migratable {
		r.condition(bi, v1alpha1.ConditionLiveMigratable, true, "ReadWriteMany", fmt.Sprintf("imports use ReadWriteMany %s volumes of StorageClass %s", st.VolumeMode, st.StorageClass))
	} else {
		r.condition(bi, v1alpha1.ConditionLiveMigratable, false, "NoReadWriteMany", reason)
	}
	im := cdi.Import{
		Namespace: bi.Namespace, Tenant: bi.Spec.Tenant, Image: image,
		Registry: r.Registry.RegistryStr(), Repository: r.repoPath(bi), Digest: digest,
		VirtualSize: bi.Status.VirtualSize, PullMethod: r.PullMethod, Storage: st,
		Instancetype: bi.Status.Instancetype, Preference: bi.Status.Preference,
	}
	if r.TenantCredentials != nil {
		data, ok, err := r.TenantCredentials.Credential(bi.Spec.Tenant)
		if err != nil {
			return cdi.Import{}, fmt.Errorf("reading the registry credential of tenant %s: %w", bi.Spec.Tenant, err)
		}
		if !ok {
			return cdi.Import{}, fmt.Errorf("%w: tenant %s has none; the syncer copies no other into its namespace", ErrNoTenantCredential, bi.Spec.Tenant)
		}
		im.SecretRef = cdi.PullSecretName
		secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: cdi.PullSecretName, Namespace: bi.Namespace}, Data: data}
		if err := ensureCopy(ctx, r.Client, secret, func(cur *corev1.Secret) bool {
			if maps.EqualFunc(cur.Data, data, func(a, b []byte) bool { return string(a) == string(b) }) {
				return false
			}
			cur.Data = data
			return true
		}); err != nil {
			return cdi.Import{}, err
		}
	}
	if len(r.CA) > 0 {
		im.CertConfig = cdi.CAConfigMapName
		data := map[string]string{"ca.crt": string(r.CA)}
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: cdi.CAConfigMapName, Namespace: bi.Namespace}, Data: data}
		if err := ensureCopy(ctx, r.Client, cm, func(cur *corev1.ConfigMap) bool {
			if maps.Equal(cur.Data, data) {
				return false
			}
			cur.Data = data
			return true
		}); err != nil {
			return cdi.Import{}, err
		}
	}
	return im, nil
}

// ensureCopy creates obj, or updates the existing object when fix reports
// that it changed it. Only objects carrying the syncer's label are updated.
func ensureCopy[T any, PT interface {
	*T
	client.Object
}](ctx context.Context, c client.Client, obj PT, fix func(PT) bool) error {
	obj.SetLabels(map[string]string{cdi.LabelManagedBy: cdi.ManagedByValue})
	cur := PT(new(T))
	err := c.Get(ctx, client.ObjectKeyFromObject(obj), cur)
	if apierrors.IsNotFound(err) {
		if err := c.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating %s/%s: %w", obj.GetNamespace(), obj.GetName(), err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading %s/%s: %w", obj.GetNamespace(), obj.GetName(), err)
	}
	if cur.GetLabels()[cdi.LabelManagedBy] != cdi.ManagedByValue {
		return fmt.Errorf("%s/%s exists and is not managed by the syncer; remove it or let the syncer own it", obj.GetNamespace(), obj.GetName())
	}
	if !fix(cur) {
		return nil
	}
	if err := c.Update(ctx, cur); err != nil {
		return fmt.Errorf("updating %s/%s: %w", obj.GetNamespace(), obj.GetName(), err)
	}
	return nil
}

// storage reads the StorageProfile of the import StorageClass.
func (r *Reconciler) storage(ctx context.Context) (cdi.Storage, bool, string, error) {
	return cdi.StorageForClass(ctx, r.Client, r.StorageClass)
}

// importDigest creates the DataVolume of the digest or follows it, counting
// failed attempts; on success it records the import in the status.
func (r *Reconciler) importDigest(ctx context.Context, bi *v1alpha1.BaseImage, im cdi.Import, dvName string) (reconcile.Result, error) {
	st := &bi.Status
	maxAttempts := r.maxAttempts()
	var dv cdiv1.DataVolume
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: bi.Namespace, Name: dvName}, &dv)
	switch {
	case apierrors.IsNotFound(err):
		if st.Attempts >= maxAttempts {
			r.failed(bi)
			return reconcile.Result{}, nil
		}
		if st.LastFailure != nil {
			if wait := st.LastFailure.Add(retryDelay(r.RetryDelay, st.Attempts)).Sub(r.now()); wait > 0 {
				return reconcile.Result{RequeueAfter: wait}, nil
			}
		}
		// The cache may lag behind the status written after the last
		// failure; an import is started only from the current object.
		if current, err := r.isCurrent(ctx, bi); err != nil || !current {
			return reconcile.Result{Requeue: true}, err
		}
		want := im.DataVolume()
		want.Labels[cdi.LabelBaseImage] = bi.Name
		if err := r.Client.Create(ctx, want); err != nil && !apierrors.IsAlreadyExists(err) {
			r.condition(bi, v1alpha1.ConditionProgressing, true, "CreateFailed", err.Error())
			return reconcile.Result{}, fmt.Errorf("creating DataVolume %s/%s: %w", bi.Namespace, dvName, err)
		}
		if seen, err := time.Parse(time.RFC3339Nano, bi.Annotations[v1alpha1.AnnotationSeenAt]); err == nil {
			r.Metrics.latency(r.now().Sub(seen))
		}
		r.logger().Info("import started", "baseimage", client.ObjectKeyFromObject(bi), "datavolume", dvName, "digest", im.Digest)
		st.Phase, st.Progress = v1alpha1.PhaseImporting, ""
		r.condition(bi, v1alpha1.ConditionProgressing, true, "Importing", fmt.Sprintf("DataVolume %s imports %s", dvName, im.Digest))
		return reconcile.Result{RequeueAfter: importingRecheck}, nil
	case err != nil:
		return reconcile.Result{}, fmt.Errorf("reading DataVolume %s/%s: %w", bi.Namespace, dvName, err)
	case !importsFor(&dv, im.DataVolume()):
		return reconcile.Result{}, r.conflict(bi, &ConflictError{Kind: "DataVolume", Namespace: bi.Namespace, Name: dvName, Owner: ownerOf(&dv)})
	}

	switch {
	case dv.Status.Phase == cdiv1.Succeeded:
		st.ImportedDigest, st.PVCName, st.Progress = im.Digest, dvName, "100.0%"
		st.Imports = slices.DeleteFunc(st.Imports, func(rec v1alpha1.ImportRecord) bool { return rec.Digest == im.Digest })
		st.Imports = slices.Insert(st.Imports, 0, v1alpha1.ImportRecord{Digest: im.Digest, DataVolume: dvName, CompletedAt: metav1.NewTime(r.now())})
		r.logger().Info("import succeeded", "baseimage", client.ObjectKeyFromObject(bi), "datavolume", dvName)
		return reconcile.Result{}, nil
	case dv.Status.Phase == cdiv1.Failed || dv.Status.RestartCount >= maxPodRestarts:
		st.Attempts++
		now := metav1.NewTime(r.now())
		st.LastFailure = &now
		if err := r.Client.Delete(ctx, &dv, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil && !apierrors.IsNotFound(err) {
			return reconcile.Result{}, fmt.Errorf("deleting failed DataVolume %s/%s: %w", bi.Namespace, dvName, err)
		}
		r.logger().Info("import failed", "baseimage", client.ObjectKeyFromObject(bi), "datavolume", dvName, "attempt", st.Attempts, "restarts", dv.Status.RestartCount)
		if st.Attempts >= maxAttempts {
			r.failed(bi)
			return reconcile.Result{}, nil
		}
		st.Phase = v1alpha1.PhaseImporting
		r.condition(bi, v1alpha1.ConditionProgressing, true, "Retrying",
			fmt.Sprintf("import attempt %d of %d failed (%s); retrying", st.Attempts, maxAttempts, dvFailure(&dv)))
		return reconcile.Result{RequeueAfter: retryDelay(r.RetryDelay, st.Attempts)}, nil
	default:
		st.Phase = v1alpha1.PhaseImporting
		st.Progress = string(dv.Status.Progress)
		r.condition(bi, v1alpha1.ConditionProgressing, true, "Importing", fmt.Sprintf("DataVolume %s imports %s", dvName, im.Digest))
		return reconcile.Result{RequeueAfter: importingRecheck}, nil
	}
}

// failed stops the retries of the observed digest.
func (r *Reconciler) failed(bi *v1alpha1.BaseImage) {
	bi.Status.Phase = v1alpha1.PhaseFailed
	r.condition(bi, v1alpha1.ConditionProgressing, false, "RetriesExhausted",
		fmt.Sprintf("the import of %s failed %d times and is not retried; push a new digest, or start over with: kubectl annotate bi -n %s %s %s=now", bi.Spec.Digest, bi.Status.Attempts, bi.Namespace, bi.Name, v1alpha1.AnnotationRetry))
}

// retry honours the retry annotation: the attempts of the digest start
// over, and the annotation is removed.
func (r *Reconciler) retry(ctx context.Context, bi *v1alpha1.BaseImage) (reconcile.Result, bool, error) {
	bi.Status.Attempts, bi.Status.LastFailure = 0, nil
	if bi.Status.Phase == v1alpha1.PhaseFailed {
		bi.Status.Phase = v1alpha1.PhaseImporting
		r.condition(bi, v1alpha1.ConditionProgressing, true, "Retrying", "imports start over, as asked with "+v1alpha1.AnnotationRetry)
	}
	status := bi.Status.DeepCopy()
	patch := client.MergeFrom(bi.DeepCopy())
	delete(bi.Annotations, v1alpha1.AnnotationRetry)
	if err := r.Client.Patch(ctx, bi, patch); err != nil {
		return reconcile.Result{}, false, fmt.Errorf("removing the retry annotation: %w", err)
	}
	bi.Status = *status // the patch answer carries the stored status
	r.logger().Info("imports start over on request", "baseimage", client.ObjectKeyFromObject(bi))
	return reconcile.Result{Requeue: true}, false, nil
}

// isCurrent reports whether bi is the newest version of the object.
func (r *Reconciler) isCurrent(ctx context.Context, bi *v1alpha1.BaseImage) (bool, error) {
	reader := r.APIReader
	if reader == nil {
		return true, nil // the client reads the API server itself
	}
	var fresh v1alpha1.BaseImage
	if err := reader.Get(ctx, client.ObjectKeyFromObject(bi), &fresh); err != nil {
		return false, fmt.Errorf("reading BaseImage %s: %w", client.ObjectKeyFromObject(bi), err)
	}
	return fresh.ResourceVersion == bi.ResourceVersion, nil
}

// retryDelay is the wait before attempt n+1: base (default 30 s)
// doubling, at most 10 min.
func retryDelay(base time.Duration, attempts int32) time.Duration {
	if base <= 0 {
		base = DefaultRetryDelay
	}
	return min(base<<min(max(attempts-1, 0), 5), 10*time.Minute)
}

func dvFailure(dv *cdiv1.DataVolume) string {
	for _, c := range dv.Status.Conditions {
		if c.Type == cdiv1.DataVolumeRunning && c.Message != "" {
			return c.Message
		}
	}
	return fmt.Sprintf("phase %s, %d importer restarts", dv.Status.Phase, dv.Status.RestartCount)
}

// serve points the DataSource at the imported digest's PVC, marks the
// BaseImage Ready and collects imports beyond the retention.
func (r *Reconciler) serve(ctx context.Context, bi *v1alpha1.BaseImage, im cdi.Import) error {
	st := &bi.Status
	name := bi.Name // one BaseImage, one DataSource, of the same name
	im.Digest, im.Tag = st.ImportedDigest, bi.Spec.Tag
	want := im.DataSource(name, st.PVCName)
	want.Labels[cdi.LabelBaseImage] = bi.Name
	want.Labels[cdi.LabelTag] = cdi.LabelValue(bi.Spec.Tag)
	var cur cdiv1.DataSource
	err := r.Client.Get(ctx, client.ObjectKeyFromObject(want), &cur)
	switch {
	case apierrors.IsNotFound(err):
		if err := r.Client.Create(ctx, want); err != nil {
			return fmt.Errorf("creating DataSource %s/%s: %w", bi.Namespace, name, err)
		}
		r.logger().Info("DataSource created", "datasource", client.ObjectKeyFromObject(want), "pvc", st.PVCName)
	case err != nil:
		return fmt.Errorf("reading DataSource %s/%s: %w", bi.Namespace, name, err)
	case !ownsDataSource(bi, &cur):
		return r.conflict(bi, &ConflictError{Kind: "DataSource", Namespace: bi.Namespace, Name: name, Owner: ownerOf(&cur)})
	case !equality.Semantic.DeepEqual(cur.Spec.Source, want.Spec.Source) || !labelsContain(cur.Labels, want.Labels):
		cur.Spec.Source = want.Spec.Source
		if cur.Labels == nil {
			cur.Labels = map[string]string{}
		}
		maps.Copy(cur.Labels, want.Labels)
		if err := r.Client.Update(ctx, &cur); err != nil {
			return fmt.Errorf("switching DataSource %s/%s: %w", bi.Namespace, name, err)
		}
		r.logger().Info("DataSource switched", "datasource", client.ObjectKeyFromObject(want), "pvc", st.PVCName, "digest", st.ImportedDigest)
	}
	st.DataSourceName = name
	if st.ImportedDigest == bi.Spec.Digest {
		st.Phase = v1alpha1.PhaseReady
		r.condition(bi, v1alpha1.ConditionProgressing, false, "Imported", "the newest digest is imported")
	}
	r.condition(bi, v1alpha1.ConditionReady, true, "Imported", fmt.Sprintf("DataSource %s serves %s", name, st.ImportedDigest))
	return r.collect(ctx, bi, im.Image, cdi.DataVolumeName(im.Image, bi.Spec.Digest))
}

func labelsContain(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
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

// collect deletes this BaseImage's DataVolumes and PVCs that are neither
// kept by the retention nor the import in progress (inFlight), unless
// another BaseImage of the namespace uses them (two tags, one digest).
func (r *Reconciler) collect(ctx context.Context, bi *v1alpha1.BaseImage, image, inFlight string) error {
	keep := int(r.keep(bi))
	if len(bi.Status.Imports) > keep {
		bi.Status.Imports = bi.Status.Imports[:keep]
	}
	wanted := map[string]bool{inFlight: inFlight != ""}
	for _, rec := range bi.Status.Imports {
		wanted[rec.DataVolume] = true
	}
	var dvs cdiv1.DataVolumeList
	if err := r.Client.List(ctx, &dvs, client.InNamespace(bi.Namespace), client.MatchingLabels{cdi.LabelImage: image, cdi.LabelTenant: bi.Spec.Tenant}); err != nil {
		return fmt.Errorf("listing DataVolumes of %s: %w", image, err)
	}
	var doomed []string
	for _, dv := range dvs.Items {
		if madeFor(bi, &dv) && !wanted[dv.Name] {
			doomed = append(doomed, dv.Name)
		}
	}
	if len(doomed) == 0 {
		return nil
	}
	used, err := r.usedElsewhere(ctx, bi, image)
	if err != nil {
		return err
	}
	for _, n := range doomed {
		if used[n] {
			continue
		}
		if err := r.deleteImport(ctx, bi, image, n); err != nil {
			return err
		}
		r.logger().Info("old import deleted", "baseimage", client.ObjectKeyFromObject(bi), "datavolume", n)
	}
	return nil
}

// usedElsewhere returns the DataVolumes other BaseImages of the image rely on.
func (r *Reconciler) usedElsewhere(ctx context.Context, bi *v1alpha1.BaseImage, image string) (map[string]bool, error) {
	var list v1alpha1.BaseImageList
	if err := r.Client.List(ctx, &list, client.InNamespace(bi.Namespace), client.MatchingLabels{cdi.LabelImage: image, cdi.LabelTenant: bi.Spec.Tenant}); err != nil {
		return nil, fmt.Errorf("listing BaseImages of %s: %w", image, err)
	}
	used := map[string]bool{}
	for _, o := range list.Items {
		if o.Name == bi.Name {
			continue
		}
		if o.Spec.Digest != "" {
			used[cdi.DataVolumeName(image, o.Spec.Digest)] = true
		}
		for _, rec := range o.Status.Imports {
			used[rec.DataVolume] = true
		}
	}
	return used, nil
}

// deleteImport deletes a DataVolume bi made and its PVC (CDI would delete
// the PVC with its DataVolume; deleting both also covers a DataVolume CDI
// already garbage-collected). Either is left alone unless it is bi's
// import: a DataVolume bi created for its repository, and that import's
// volume.
func (r *Reconciler) deleteImport(ctx context.Context, bi *v1alpha1.BaseImage, image, name string) error {
	ns := bi.Namespace
	bg := client.PropagationPolicy(metav1.DeletePropagationBackground)
	var dv cdiv1.DataVolume
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &dv)
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return fmt.Errorf("reading DataVolume %s/%s: %w", ns, name, err)
	case !madeFor(bi, &dv):
		r.logger().Info("import not deleted: it is not this BaseImage's", "baseimage", client.ObjectKeyFromObject(bi), "datavolume", name, "owner", ownerOf(&dv))
		return nil
	default:
		if err := r.Client.Delete(ctx, &dv, bg, client.Preconditions{UID: &dv.UID}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting DataVolume %s/%s: %w", ns, name, err)
		}
	}
	var pvc corev1.PersistentVolumeClaim
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &pvc); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("reading PVC %s/%s: %w", ns, name, err)
	}
	if !volumeOf(&pvc, name, bi.Spec.Tenant, image) {
		r.logger().Info("volume not deleted: it is not this BaseImage's import", "baseimage", client.ObjectKeyFromObject(bi), "pvc", name)
		return nil
	}
	if err := r.Client.Delete(ctx, &pvc, bg, client.Preconditions{UID: &pvc.UID}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting PVC %s/%s: %w", ns, name, err)
	}
	return nil
}

// deleteAll applies the delete policy: the DataSource, every import not
// used by another tag, then the BaseImage itself.
func (r *Reconciler) deleteAll(ctx context.Context, bi *v1alpha1.BaseImage, image string) error {
	if n := bi.Status.DataSourceName; n != "" {
		var ds cdiv1.DataSource
		err := r.Client.Get(ctx, client.ObjectKey{Namespace: bi.Namespace, Name: n}, &ds)
		if err == nil && ownsDataSource(bi, &ds) {
			err = r.Client.Delete(ctx, &ds, client.Preconditions{UID: &ds.UID})
		}
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting DataSource %s/%s: %w", bi.Namespace, n, err)
		}
	}
	if err := r.collectAll(ctx, bi, image); err != nil {
		return err
	}
	// Only the version that was marked removed: a push since then wins.
	rv := bi.ResourceVersion
	if err := r.Client.Delete(ctx, bi, client.Preconditions{UID: &bi.UID, ResourceVersion: &rv}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting BaseImage %s/%s: %w", bi.Namespace, bi.Name, err)
	}
	r.logger().Info("tag removed from the registry; its imports deleted (deletion policy delete)", "baseimage", client.ObjectKeyFromObject(bi))
	return nil
}

// collectAll deletes every import of bi not used by another tag.
func (r *Reconciler) collectAll(ctx context.Context, bi *v1alpha1.BaseImage, image string) error {
	used, err := r.usedElsewhere(ctx, bi, image)
	if err != nil {
		return err
	}
	var dvs cdiv1.DataVolumeList
	if err := r.Client.List(ctx, &dvs, client.InNamespace(bi.Namespace), client.MatchingLabels{cdi.LabelBaseImage: bi.Name}); err != nil {
		return fmt.Errorf("listing DataVolumes of %s: %w", image, err)
	}
	names := map[string]bool{}
	for _, dv := range dvs.Items {
		if madeFor(bi, &dv) {
			names[dv.Name] = true
		}
	}
	if bi.Status.PVCName != "" {
		names[bi.Status.PVCName] = true
	}
	for n := range names {
		if used[n] {
			continue
		}
		if err := r.deleteImport(ctx, bi, image, n); err != nil {
			return err
		}
	}
	return nil
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

func (r *Reconciler) logger() *slog.Logger {
	if r.Logger != nil {
		return r.Logger
	}
	return slog.New(slog.DiscardHandler)
}

func envValue(env []string, key string) string {
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, key+"="); ok {
			return v
		}
	}
	return ""
}

// conditionReason turns rejection codes ("backing-file") into a condition
// reason, which must be CamelCase ("BackingFile").
func conditionReason(codes []string) string {
	if len(codes) == 0 {
		return "Rejected"
	}
	var b strings.Builder
	for _, part := range strings.FieldsFunc(codes[0], func(r rune) bool { return r == '-' || r == '_' || r == '.' }) {
		b.WriteString(strings.ToUpper(part[:1]) + part[1:])
	}
	if b.Len() == 0 {
		return "Rejected"
	}
	return b.String()
}
