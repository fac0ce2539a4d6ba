package hub

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/imagepipe/imagepipe/internal/cdi"
	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/internal/reject"
	"github.com/imagepipe/imagepipe/internal/verdict"
	"github.com/imagepipe/imagepipe/pkg/api"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
)

// Verdicts finds the gate's signed verdict on a pushed digest; a digest
// without a trusted one is an error matching verdict.ErrNoVerdict.
// Forget drops what it knows or is finding out about subject, after
// something was attached to it. GateVerdicts implements it.
type Verdicts interface {
	Verdict(ctx context.Context, subject name.Digest) (*api.Verdict, error)
	Forget(subject name.Digest)
	// Expect has the next look-ups of subject read referrer too, a
	// verdict a registry event announced before the registry lists it,
	// whose manifest was read by its digest.
	Expect(subject name.Digest, referrer *registry.RawManifest)
}

// ReasonNoVerdict is the Rejected condition's reason while a digest has
// no verdict from the gate yet; it records no Event.
const ReasonNoVerdict = "NoVerdict"

// Bounds of the wait for a verdict: a digest without one is looked at
// again after a quarter of the time since the syncer learnt of it, at
// least verdictRecheckMin and at most verdictRecheckMax; a digest refused
// for want of its tenant's signature at most signatureRecheckMax. For
// attachedRecheckFor after a follower stamped an attachment, every
// attachedRecheck.
const (
	attachedRecheck     = 250 * time.Millisecond
	attachedRecheckFor  = 2 * time.Second
	verdictRecheckMin   = 2 * time.Second
	verdictRecheckMax   = time.Minute
	signatureRecheckMax = 5 * time.Minute
)

// recheckAfter is when to look for bi's verdict again: a quarter of the
// time since the syncer learnt of its digest, bounded by
// verdictRecheckMin and longest. Within attachedRecheckFor of a
// follower's AnnotationAttachedAt stamp it is attachedRecheck: the
// registry may not list the attachment yet (distribution announces a tag
// before the tag points at the new index), as the leader's own wakes
// allow for by looking again.
func (r *Reconciler) recheckAfter(bi *v1alpha1.BaseImage, longest time.Duration) time.Duration {
	if at, err := time.Parse(time.RFC3339Nano, bi.Annotations[v1alpha1.AnnotationAttachedAt]); err == nil && r.now().Sub(at) < attachedRecheckFor {
		return attachedRecheck
	}
	seen, err := time.Parse(time.RFC3339Nano, bi.Annotations[v1alpha1.AnnotationSeenAt])
	if err != nil {
		return verdictRecheckMin
	}
	return min(max(r.now().Sub(seen)/4, verdictRecheckMin), longest)
}

// joinReasons is a verdict's reasons as one sentence.
func joinReasons(reasons []api.Rejection) string {
	var parts []string
	for _, rj := range reasons {
		parts = append(parts, rj.Code+": "+rj.Message)
	}
	return strings.Join(parts, "; ")
}

// admission is what the gate's verdicts say of one digest on this hub.
type admission struct {
	// image is the verified image to import, its Canonical the digest CDI
	// reads; nil unless an accepted verdict signed by a trusted key names
	// one for this hub's architecture.
	image *api.VerifiedImage
	// verdict is the newest trusted verdict; nil when there is none (yet).
	verdict *api.Verdict
	// missing holds why there is no verdict: none yet, or only untrusted ones.
	missing *verdict.NoVerdictError
	// reasons are why the digest is not admitted, when a verdict refused it.
	reasons []api.Rejection
}

// final reports whether a verdict decided the digest's fate: a tenant's
// signature cannot change it.
func (a admission) final() bool {
	return a.verdict != nil && !verdict.AwaitsSignature(a.verdict)
}

// admissionOf reads the gate's verdict on digest. Nothing but a verdict
// counts: whatever the BaseImage's status says, a digest is admitted only
// while an accepted verdict, signed by a provider key, names its
// canonical image for this hub. An error (the registry is unreachable)
// says nothing either way.
func (r *Reconciler) admissionOf(ctx context.Context, bi *v1alpha1.BaseImage, digest string) (admission, error) {
	ref := r.Registry.Repo(r.repoPath(bi)).Digest(digest)
	v, err := r.Verdicts.Verdict(ctx, ref)
	var nv *verdict.NoVerdictError
	switch {
	case errors.As(err, &nv):
		return admission{missing: nv}, nil
	case err != nil:
		return admission{}, fmt.Errorf("reading the verdict on %s: %w", ref, err)
	}
	a := admission{verdict: v, reasons: v.Reasons}
	if v.Verdict != api.VerdictAccepted || verdict.AwaitsSignature(v) {
		return a, nil
	}
	if a.image = imageFor(v.Images, r.Architecture); a.image == nil {
		a.reasons = []api.Rejection{{Code: string(reject.PlatformMismatch), Message: fmt.Sprintf("the image holds %s; this hub runs %s", platforms(v.Images), r.Architecture)}}
	} else if g := a.image.Guest; r.HoldUnknownGuests && (g == nil || g.OS == nil) {
		a.image = nil
		a.reasons = []api.Rejection{{Code: string(reject.UnknownGuest), Message: "the gate could not tell which operating system the disk holds" + guestNotes(g) + "; this hub imports only images whose guest is known (image-syncer --unknown-guests hold)"}}
	} else if r.RequireBoot && (g == nil || g.Boot == nil || !g.Boot.Booted) {
		a.image = nil
		a.reasons = []api.Rejection{{Code: string(reject.NotBooted), Message: notBooted(g) + "; this hub imports only images the gate saw boot (image-syncer --require-boot)"}}
	}
	return a, nil
}

// notBooted says why the verdict's guest g does not count as booted.
func notBooted(g *api.GuestReport) string {
	if g == nil || g.Boot == nil {
		return "the gate did not boot the disk (no boot check in its verdict)"
	}
	msg := fmt.Sprintf("the disk did not boot in the gate's boot check (%s", g.Boot.Reason)
	if n := len(g.Boot.LastLines); n > 0 {
		msg += fmt.Sprintf("; its console's last line: %q", g.Boot.LastLines[n-1])
	}
	return msg + ")"
}

// admit records in bi's status what a names of digest, and returns when
// to look again for a verdict that may still come or change. The
// canonical digest in the status is always the one a names, and empty
// unless the digest is admitted.
func (r *Reconciler) admit(ctx context.Context, bi *v1alpha1.BaseImage, digest string, a admission) time.Duration {
	st := &bi.Status
	switch {
	case a.missing != nil:
		reason := ReasonNoVerdict
		msg := fmt.Sprintf("the gate has not given its verdict on %s yet; nothing is imported without one", digest)
		if a.missing.Forged() {
			reason, msg = "UntrustedVerdict", a.missing.Error()+"; nothing is imported without a verdict signed by a provider key"
		}
		st.ObservedDigest, st.CanonicalDigest = "", ""
		bi.Status.Phase = v1alpha1.PhasePending
		r.condition(bi, v1alpha1.ConditionRejected, true, reason, msg)
		r.condition(bi, v1alpha1.ConditionProgressing, true, "AwaitingVerdict", msg)
		return r.recheckAfter(bi, verdictRecheckMax)
	case !a.final():
		// The tenant may still sign the digest: the gate then gives a new
		// verdict, so the digest stays unobserved and is looked at again.
		st.ObservedDigest, st.CanonicalDigest = "", ""
		msg := "the gate refused the image: " + joinReasons(a.reasons)
		bi.Status.Phase = v1alpha1.PhaseRejected
		r.condition(bi, v1alpha1.ConditionRejected, true, conditionReason([]string{a.reasons[0].Code}), msg)
		r.condition(bi, v1alpha1.ConditionProgressing, true, "AwaitingSignature", "nothing is imported until the tenant signs "+digest+" with one of its keys (imagectl sign, cosign sign)")
		return r.recheckAfter(bi, signatureRecheckMax)
	}
	if st.ObservedDigest != digest {
		st.ObservedDigest, st.ShortDigest = digest, strings.TrimPrefix(digest, "sha256:")[:12]
		st.Attempts, st.Progress, st.LastFailure = 0, "", nil
	}
	if a.image == nil {
		st.CanonicalDigest = ""
		var codes []string
		for _, rj := range a.reasons {
			codes = append(codes, rj.Code)
		}
		if !meta.IsStatusConditionTrue(st.Conditions, v1alpha1.ConditionRejected) {
			log.FromContext(ctx).Info("image rejected", "baseimage", client.ObjectKeyFromObject(bi), "digest", digest, "reasons", codes)
		}
		// A verdict that accepted the image was refused by this hub's own
		// rules (its architecture, its policy on unknown guests).
		msg := "the gate refused the image: "
		if v := a.verdict; v != nil && v.Verdict == api.VerdictAccepted {
			msg = "the gate accepted the image, but this hub does not import it: "
		}
		r.condition(bi, v1alpha1.ConditionRejected, true, conditionReason(codes), msg+joinReasons(a.reasons))
		r.condition(bi, v1alpha1.ConditionProgressing, false, "Rejected", "nothing is imported from a rejected image")
		return 0
	}
	v, img := a.verdict, a.image
	st.CanonicalDigest = img.Canonical
	st.VirtualSize, st.DiskSize = img.VirtualSize, img.DiskSize
	st.Instancetype, st.Preference = img.Instancetype, img.Preference
	if st.Preference == "" { // the tenant's declared hint wins
		st.Preference = r.Preferences.Table(ctx).For(img.Guest, r.Architecture)
	}
	r.condition(bi, v1alpha1.ConditionRejected, false, "Verified",
		fmt.Sprintf("%s %s verified the image in full at %s; CDI imports its canonical image %s", v.Engine, v.EngineVersion, v.VerifiedAt, img.Canonical))
	return 0
}

// imageFor picks the verified image for a hub of architecture arch
// (amd64 when empty).
func imageFor(images []api.VerifiedImage, arch string) *api.VerifiedImage {
	if arch == "" {
		arch = "amd64"
	}
	for i, im := range images {
		if im.Platform == "linux/"+arch || strings.HasPrefix(im.Platform, "linux/"+arch+"/") {
			return &images[i]
		}
	}
	return nil
}

func platforms(images []api.VerifiedImage) string {
	var p []string
	for _, im := range images {
		p = append(p, im.Platform)
	}
	return strings.Join(p, ", ")
}

// importOf gathers what the DataVolume of digest needs: storage choice,
// the names of the registry credential and CA in the namespace, the
// image's hints; and the tenant's registry credential, which copyForImport
// copies there (nil when imports carry none).
func (r *Reconciler) importOf(ctx context.Context, bi *v1alpha1.BaseImage, image, digest string) (cdi.Import, map[string][]byte, error) {
	st, migratable, reason, err := r.storage(ctx)
	if err != nil {
		return cdi.Import{}, nil, err
	}
	if migratable {
		r.condition(bi, v1alpha1.ConditionLiveMigratable, true, "ReadWriteMany", fmt.Sprintf("imports use ReadWriteMany %s volumes of StorageClass %s", st.VolumeMode, st.StorageClass))
	} else {
		r.condition(bi, v1alpha1.ConditionLiveMigratable, false, "NoReadWriteMany", reason)
	}
	im := cdi.Import{
		Namespace: bi.Namespace, Tenant: bi.Spec.Tenant, Image: image,
		Registry: r.Registry.RegistryStr(), Repository: r.repoPath(bi), Digest: digest,
		Canonical:   bi.Status.CanonicalDigest,
		VirtualSize: bi.Status.VirtualSize, DiskSize: bi.Status.DiskSize, PullMethod: r.PullMethod, Storage: st,
		Instancetype: bi.Status.Instancetype, Preference: bi.Status.Preference,
	}
	var credential map[string][]byte
	if r.TenantCredentials != nil {
		data, ok, err := r.TenantCredentials.Credential(bi.Spec.Tenant)
		if err != nil {
			return cdi.Import{}, nil, fmt.Errorf("reading the registry credential of tenant %s: %w", bi.Spec.Tenant, err)
		}
		if !ok {
			return cdi.Import{}, nil, fmt.Errorf("%w: tenant %s has none; the syncer copies no other into its namespace", ErrNoTenantCredential, bi.Spec.Tenant)
		}
		im.SecretRef, credential = cdi.PullSecretName, data
	}
	if len(r.CA) > 0 {
		im.CertConfig = cdi.CAConfigMapName
	}
	return im, credential, nil
}

// copyForImport puts what CDI's importer reads besides the DataVolume
// into namespace ns: the tenant's registry credential (when not nil) as
// the Secret cdi.PullSecretName, and the registry's CA, when set, as the
// ConfigMap cdi.CAConfigMapName. Each is written only when it differs.
func (r *Reconciler) copyForImport(ctx context.Context, ns string, credential map[string][]byte) error {
	if credential != nil {
		secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: cdi.PullSecretName, Namespace: ns}, Data: credential}
		if err := ensureCopy(ctx, r.Client, secret, func(cur *corev1.Secret) bool {
			if maps.EqualFunc(cur.Data, credential, func(a, b []byte) bool { return string(a) == string(b) }) {
				return false
			}
			cur.Data = credential
			return true
		}); err != nil {
			return err
		}
	}
	if len(r.CA) > 0 {
		data := map[string]string{"ca.crt": string(r.CA)}
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: cdi.CAConfigMapName, Namespace: ns}, Data: data}
		if err := ensureCopy(ctx, r.Client, cm, func(cur *corev1.ConfigMap) bool {
			if maps.Equal(cur.Data, data) {
				return false
			}
			cur.Data = data
			return true
		}); err != nil {
			return err
		}
	}
	return nil
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
	return cdi.StorageForClass(ctx, cdiReader{r.Client}, r.StorageClass)
}

// cdiReader reads for the cdi package through the manager's client.
type cdiReader struct{ c client.Reader }

func (a cdiReader) Get(ctx context.Context, namespace, name string, obj runtime.Object) error {
	o, ok := obj.(client.Object)
	if !ok {
		return fmt.Errorf("%T is not a Kubernetes object", obj)
	}
	return a.c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, o)
}

func (a cdiReader) List(ctx context.Context, namespace, selector string, list runtime.Object) error {
	l, ok := list.(client.ObjectList)
	if !ok {
		return fmt.Errorf("%T is not a Kubernetes list", list)
	}
	sel, err := labels.Parse(selector)
	if err != nil {
		return fmt.Errorf("parsing the label selector %q: %w", selector, err)
	}
	return a.c.List(ctx, l, client.InNamespace(namespace), client.MatchingLabelsSelector{Selector: sel})
}

// importDigest creates the DataVolume of the digest or follows it, counting
// failed attempts; on success it records the import in the status.
func (r *Reconciler) importDigest(ctx context.Context, bi *v1alpha1.BaseImage, im cdi.Import, dvName string) (reconcile.Result, error) {
	st := &bi.Status
	maxAttempts := r.maxAttempts()
	want, err := im.DataVolume()
	if err != nil {
		return reconcile.Result{}, err
	}
	var dv cdiv1.DataVolume
	err = r.Client.Get(ctx, client.ObjectKey{Namespace: bi.Namespace, Name: dvName}, &dv)
	switch {
	case apierrors.IsNotFound(err):
		return r.startImport(ctx, bi, im, want)
	case err != nil:
		return reconcile.Result{}, fmt.Errorf("reading DataVolume %s/%s: %w", bi.Namespace, dvName, err)
	case !importsFor(&dv, want) && madeFor(bi, &dv) && dv.Annotations[cdi.AnnotationDigest] == im.Digest:
		// This BaseImage's own import of the digest, from other bytes than
		// the canonical image (an image-syncer before the gate imported the
		// pushed digest): it is replaced, never served.
		if err := r.deleteImport(ctx, bi, im.Image, dvName); err != nil {
			return reconcile.Result{}, err
		}
		log.FromContext(ctx).Info("import replaced: it did not read the canonical image", "baseimage", client.ObjectKeyFromObject(bi), "datavolume", dvName, "url", importURL(&dv))
		return reconcile.Result{RequeueAfter: replacedRecheck}, nil
	case !importsFor(&dv, want):
		return reconcile.Result{}, r.conflict(bi, &ConflictError{Kind: "DataVolume", Namespace: bi.Namespace, Name: dvName, Owner: ownerOf(&dv)})
	}

	switch {
	case dv.Status.Phase == cdiv1.Succeeded:
		st.ImportedDigest, st.PVCName, st.Progress = im.Digest, dvName, "100.0%"
		st.Imports = slices.DeleteFunc(st.Imports, func(rec v1alpha1.ImportRecord) bool { return rec.Digest == im.Digest })
		st.Imports = slices.Insert(st.Imports, 0, v1alpha1.ImportRecord{Digest: im.Digest, DataVolume: dvName, CompletedAt: metav1.NewTime(r.now())})
		log.FromContext(ctx).Info("import succeeded", "baseimage", client.ObjectKeyFromObject(bi), "datavolume", dvName)
		return reconcile.Result{}, nil
	case attemptFailed(&dv):
		st.Attempts++
		now := metav1.NewTime(r.now())
		st.LastFailure = &now
		if err := r.Client.Delete(ctx, &dv, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil && !apierrors.IsNotFound(err) {
			return reconcile.Result{}, fmt.Errorf("deleting failed DataVolume %s/%s: %w", bi.Namespace, dvName, err)
		}
		log.FromContext(ctx).Info("import failed", "baseimage", client.ObjectKeyFromObject(bi), "datavolume", dvName, "attempt", st.Attempts, "restarts", dv.Status.RestartCount)
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

// startImport creates the DataVolume of the digest, unless the attempts
// are used up or the wait after the last failure has not passed.
func (r *Reconciler) startImport(ctx context.Context, bi *v1alpha1.BaseImage, im cdi.Import, want *cdiv1.DataVolume) (reconcile.Result, error) {
	dvName := want.Name
	st := &bi.Status
	if st.Attempts >= r.maxAttempts() {
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
	if err := r.current(ctx, bi); err != nil {
		return reconcile.Result{}, err
	}
	want.Labels[cdi.LabelBaseImage] = bi.Name
	if err := r.Client.Create(ctx, want); err != nil && !apierrors.IsAlreadyExists(err) {
		r.condition(bi, v1alpha1.ConditionProgressing, true, "CreateFailed", err.Error())
		return reconcile.Result{}, fmt.Errorf("creating DataVolume %s/%s: %w", bi.Namespace, dvName, err)
	}
	if seen, err := time.Parse(time.RFC3339Nano, bi.Annotations[v1alpha1.AnnotationSeenAt]); err == nil {
		r.Metrics.latency(r.now().Sub(seen))
	}
	log.FromContext(ctx).Info("import started", "baseimage", client.ObjectKeyFromObject(bi), "datavolume", dvName, "digest", im.Digest)
	st.Phase, st.Progress = v1alpha1.PhaseImporting, ""
	r.condition(bi, v1alpha1.ConditionProgressing, true, "Importing", fmt.Sprintf("DataVolume %s imports %s", dvName, im.Digest))
	return reconcile.Result{RequeueAfter: importingRecheck}, nil
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
	log.FromContext(ctx).Info("imports start over on request", "baseimage", client.ObjectKeyFromObject(bi))
	return reconcile.Result{RequeueAfter: busyRecheck}, false, nil
}

// retryDelay is the wait before attempt n+1: base (default 30 s)
// doubling, at most 10 min.
func retryDelay(base time.Duration, attempts int32) time.Duration {
	if base <= 0 {
		base = DefaultRetryDelay
	}
	return min(base<<min(max(attempts-1, 0), 5), 10*time.Minute)
}

// attemptFailed reports whether the DataVolume's import attempt is over and
// failed: CDI gave up, or its importer failed maxPodRestarts times (CDI
// itself restarts it for ever). An importer that runs again after its last
// restart is let finish: a run that succeeds counts, and one that fails
// leaves its termination message on the DataVolume, where CDI clears it
// while the importer runs, so the attempt's failure names its cause.
func attemptFailed(dv *cdiv1.DataVolume) bool {
	if dv.Status.Phase == cdiv1.Failed {
		return true
	}
	return dv.Status.RestartCount >= maxPodRestarts && !importerRunning(dv)
}

// importerRunning reports whether CDI says the DataVolume's importer runs.
func importerRunning(dv *cdiv1.DataVolume) bool {
	for _, c := range dv.Status.Conditions {
		if c.Type == cdiv1.DataVolumeRunning {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// dvFailure says why the DataVolume's import failed, in CDI's words when
// it has them.
func dvFailure(dv *cdiv1.DataVolume) string {
	for _, c := range dv.Status.Conditions {
		if c.Type == cdiv1.DataVolumeRunning && c.Message != "" {
			return c.Message
		}
	}
	return fmt.Sprintf("phase %s, %d importer restarts", dv.Status.Phase, dv.Status.RestartCount)
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

// guestNotes is what the gate noted of a guest it could not read, as the
// end of a sentence.
func guestNotes(g *api.GuestReport) string {
	if g == nil {
		return " (its verdict has no guest report)"
	}
	if len(g.Notes) == 0 {
		return ""
	}
	return " (" + strings.Join(g.Notes, "; ") + ")"
}
