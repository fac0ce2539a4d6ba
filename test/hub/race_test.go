package hub

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-containerregistry/pkg/name"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/imagepipe/imagepipe/internal/cdi"
	"github.com/imagepipe/imagepipe/internal/hub"
	"github.com/imagepipe/imagepipe/internal/intake"
	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/internal/verdict"
	"github.com/imagepipe/imagepipe/pkg/api"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
	"github.com/imagepipe/imagepipe/test/harness"
)

// resolverFunc plays the registry's answer to a tag look-up.
type resolverFunc func(ctx context.Context, ref name.Tag) (string, bool, error)

func (f resolverFunc) Resolve(ctx context.Context, ref name.Tag) (string, bool, error) {
	return f(ctx, ref)
}

// applierParts are what an Applier needs besides its client: the
// registry whose events it applies, and the default tenancy.
func applierParts(t *testing.T) (name.Registry, *hub.Tenancy) {
	t.Helper()
	reg, err := name.NewRegistry("registry.example.com")
	if err != nil {
		t.Fatal(err)
	}
	tenancy, err := hub.NewTenancy("", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return reg, tenancy
}

// TestDeleteRacingARepush: a delete notification is being confirmed while
// the tag is pushed again and the push is applied (another worker, another
// replica). The registry's "not found" was about the old digest; it must
// not mark the new one removed. On a real apiserver, the mark is written
// against the BaseImage as read before the registry was asked, so it fails
// with a conflict and the event is retried.
func TestDeleteRacingARepush(t *testing.T) {
	t.Parallel()
	cluster := harness.StartSyncerHub(t, "hub-a", harness.SyncerHubOptions{Namespaces: []string{"acme"}})
	reg, tenancy := applierParts(t)
	d1, d2 := "sha256:"+strings.Repeat("1", 64), "sha256:"+strings.Repeat("2", 64)
	pusher := &hub.Applier{Client: cluster.Client, Registry: reg, Tenancy: tenancy}
	if err := pusher.Apply(t.Context(), intake.Event{Action: intake.ActionPush, Repository: "acme/rhel", Tag: "9", Digest: d1}); err != nil {
		t.Fatal(err)
	}
	deleter := &hub.Applier{Client: cluster.Client, Registry: reg, Tenancy: tenancy, Resolver: resolverFunc(func(ctx context.Context, _ name.Tag) (string, bool, error) {
		// The tag was deleted, and is pushed again before the delete is applied.
		if err := pusher.Apply(ctx, intake.Event{Action: intake.ActionPush, Repository: "acme/rhel", Tag: "9", Digest: d2}); err != nil {
			t.Error(err)
		}
		return "", false, nil
	})}
	err := deleter.Apply(t.Context(), intake.Event{Action: intake.ActionDelete, Repository: "acme/rhel", Tag: "9"})
	if !apierrors.IsConflict(err) {
		t.Errorf("the delete raced by a push: %v; want a conflict, retried later", err)
	}
	var bi v1alpha1.BaseImage
	if err := cluster.Client.Get(t.Context(), client.ObjectKey{Namespace: "acme", Name: cdi.BaseImageName("acme/rhel", "9")}, &bi); err != nil {
		t.Fatal(err)
	}
	if _, removed := bi.Annotations[v1alpha1.AnnotationRemoved]; removed || bi.Spec.Digest != d2 {
		t.Errorf("after the race: digest %s, annotations %v; want the new digest, not removed", bi.Spec.Digest, bi.Annotations)
	}
	// Retried, the look-up now finds the new digest: nothing changes.
	deleter.Resolver = resolverFunc(func(context.Context, name.Tag) (string, bool, error) { return d2, true, nil })
	if err := deleter.Apply(t.Context(), intake.Event{Action: intake.ActionDelete, Repository: "acme/rhel", Tag: "9"}); err != nil {
		t.Errorf("the retried delete: %v", err)
	}
}

// staleCache plays a controller-runtime cache that has not seen any
// BaseImage yet, as after an API server outage while its watch backs off.
type staleCache struct{ client.Client }

func (c staleCache) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if _, ok := obj.(*v1alpha1.BaseImage); ok {
		return apierrors.NewNotFound(v1alpha1.GroupVersion.WithResource("baseimages").GroupResource(), key.Name)
	}
	return c.Client.Get(ctx, key, obj, opts...)
}

// TestPushAppliedWhileTheCacheLags: a push for a BaseImage the cache has not
// seen is applied to the stored object, not retried until the cache
// catches up (which took over a minute after an API server restart).
func TestPushAppliedWhileTheCacheLags(t *testing.T) {
	t.Parallel()
	cluster := harness.StartSyncerHub(t, "hub-a", harness.SyncerHubOptions{Namespaces: []string{"acme"}, NoCDI: true})
	reg, tenancy := applierParts(t)
	d1, d2 := "sha256:"+strings.Repeat("1", 64), "sha256:"+strings.Repeat("2", 64)
	fresh := &hub.Applier{Client: cluster.Client, Registry: reg, Tenancy: tenancy}
	if err := fresh.Apply(t.Context(), intake.Event{Action: intake.ActionPush, Repository: "acme/rhel", Tag: "9", Digest: d1}); err != nil {
		t.Fatal(err)
	}
	lagging := &hub.Applier{Client: staleCache{cluster.Client}, APIReader: cluster.Client, Registry: reg, Tenancy: tenancy}
	if err := lagging.Apply(t.Context(), intake.Event{Action: intake.ActionPush, Repository: "acme/rhel", Tag: "9", Digest: d2}); err != nil {
		t.Errorf("a push applied through a lagging cache: %v", err)
	}
	var bi v1alpha1.BaseImage
	if err := cluster.Client.Get(t.Context(), client.ObjectKey{Namespace: "acme", Name: cdi.BaseImageName("acme/rhel", "9")}, &bi); err != nil {
		t.Fatal(err)
	}
	if bi.Spec.Digest != d2 {
		t.Errorf("the BaseImage names %s, want the pushed %s", bi.Spec.Digest, d2)
	}
}

// snapshotCache plays a controller-runtime cache that still holds an older
// copy of one BaseImage: under load, the watch delivers the status the
// reconciler just wrote a second or more later.
type snapshotCache struct {
	client.Client
	old *v1alpha1.BaseImage
}

func (c snapshotCache) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if bi, ok := obj.(*v1alpha1.BaseImage); ok && key == client.ObjectKeyFromObject(c.old) {
		c.old.DeepCopyInto(bi)
		return nil
	}
	return c.Client.Get(ctx, key, obj, opts...)
}

// acceptedVerdicts plays the gate: every digest has an accepted verdict
// for linux/amd64, its canonical image the digest itself.
type acceptedVerdicts struct{}

func (acceptedVerdicts) Verdict(_ context.Context, subject name.Digest) (*api.Verdict, error) {
	return &api.Verdict{
		Repository: subject.RepositoryStr(), Subject: subject.DigestStr(), Verdict: api.VerdictAccepted,
		Images: []api.VerifiedImage{{Platform: "linux/amd64", Canonical: subject.DigestStr(), Format: "qcow2", VirtualSize: 1 << 30, DiskSize: 1 << 20}},
		Engine: "imagepipe-gate", EngineVersion: "test", VerifiedAt: time.Now().UTC().Format(api.VerdictTimeFormat),
	}, nil
}
func (acceptedVerdicts) Forget(name.Digest)                        {}
func (acceptedVerdicts) Expect(name.Digest, *registry.RawManifest) {}

// noVerdicts plays a gate that has not given its verdict yet.
type noVerdicts struct{ acceptedVerdicts }

func (noVerdicts) Verdict(_ context.Context, subject name.Digest) (*api.Verdict, error) {
	return nil, &verdict.NoVerdictError{Subject: subject.String()}
}

// quietContext is the test's context with a logger that discards, as
// the controller's would carry one.
func quietContext(t *testing.T) context.Context {
	return ctrllog.IntoContext(t.Context(), logr.Discard())
}

// laggingHub is a hub with BaseImage acme/rhel:9 at digest, whose status
// was written once after cached was read: a cache holding cached lags.
func laggingHub(t *testing.T, digest string) (cluster *harness.SyncerHub, reg name.Registry, key client.ObjectKey, cached *v1alpha1.BaseImage) {
	t.Helper()
	cluster = harness.StartSyncerHub(t, "hub-a", harness.SyncerHubOptions{Namespaces: []string{"acme"}, NoCDI: true})
	reg, tenancy := applierParts(t)
	applier := &hub.Applier{Client: cluster.Client, Registry: reg, Tenancy: tenancy}
	if err := applier.Apply(t.Context(), intake.Event{Action: intake.ActionPush, Repository: "acme/rhel", Tag: "9", Digest: digest}); err != nil {
		t.Fatal(err)
	}
	key = client.ObjectKey{Namespace: "acme", Name: cdi.BaseImageName("acme/rhel", "9")}
	var bi v1alpha1.BaseImage
	if err := cluster.Client.Get(t.Context(), key, &bi); err != nil {
		t.Fatal(err)
	}
	cached = bi.DeepCopy()
	bi.Status.Phase = v1alpha1.PhasePending // the reconciler's write while no verdict was there
	if err := cluster.Client.Status().Update(t.Context(), &bi); err != nil {
		t.Fatal(err)
	}
	return cluster, reg, key, cached
}

// TestAnImportStartsWhileTheCacheLags: the verdict arrives while the
// controller's cache still holds the BaseImage as it was before the
// reconciler's last status write. The import starts from the API server's
// copy in the same reconcile, instead of being requeued through the
// backoff until the cache catches up (which put push → DataVolume past a
// second under load).
func TestAnImportStartsWhileTheCacheLags(t *testing.T) {
	t.Parallel()
	digest := "sha256:" + strings.Repeat("3", 64)
	cluster, reg, key, cached := laggingHub(t, digest)
	r := &hub.Reconciler{Client: snapshotCache{cluster.Client, cached}, APIReader: cluster.Client, Registry: reg, Verdicts: acceptedVerdicts{}}
	res, err := r.Reconcile(quietContext(t), reconcile.Request{NamespacedName: key})
	if err != nil {
		t.Fatal(err)
	}
	var dv cdiv1.DataVolume
	dvKey := client.ObjectKey{Namespace: "acme", Name: cdi.DataVolumeName(cdi.ImageName("acme/rhel"), digest)}
	if err := cluster.Client.Get(t.Context(), dvKey, &dv); err != nil {
		t.Fatalf("after one reconcile through a lagging cache (result %+v): %v; want DataVolume %s created", res, err, dvKey.Name)
	}
	var bi v1alpha1.BaseImage
	if err := cluster.Client.Get(t.Context(), key, &bi); err != nil {
		t.Fatal(err)
	}
	if bi.Status.Phase != v1alpha1.PhaseImporting || bi.Status.ObservedDigest != digest {
		t.Errorf("BaseImage status: phase %s, observed %q; want Importing %s", bi.Status.Phase, bi.Status.ObservedDigest, digest)
	}
}

// TestAStatusIsWrittenWhileTheCacheLags: a status write from a stale copy
// conflicts; the reconcile goes on from the API server's copy and writes
// the status then, instead of leaving the BaseImage unreported until a
// requeue through the backoff.
func TestAStatusIsWrittenWhileTheCacheLags(t *testing.T) {
	t.Parallel()
	cluster, reg, key, cached := laggingHub(t, "sha256:"+strings.Repeat("4", 64))
	r := &hub.Reconciler{Client: snapshotCache{cluster.Client, cached}, APIReader: cluster.Client, Registry: reg, Verdicts: noVerdicts{}}
	res, err := r.Reconcile(quietContext(t), reconcile.Request{NamespacedName: key})
	if err != nil {
		t.Fatal(err)
	}
	var bi v1alpha1.BaseImage
	if err := cluster.Client.Get(t.Context(), key, &bi); err != nil {
		t.Fatal(err)
	}
	c := meta.FindStatusCondition(bi.Status.Conditions, v1alpha1.ConditionRejected)
	if c == nil || c.Reason != hub.ReasonNoVerdict || res.RequeueAfter <= 0 {
		t.Errorf("after one reconcile through a lagging cache: Rejected condition %+v, result %+v; want reason %s and a recheck", c, res, hub.ReasonNoVerdict)
	}
}
