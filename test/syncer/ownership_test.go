package syncer

import (
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/imagepipe/imagepipe/internal/cdi"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// TestSyncerNamesAreInjectiveAndOwned: tags and repositories whose names
// collided before (v1.0, v1-0 and v1_0 of one image; foo:bar-latest and
// foo-bar:latest) each get their own BaseImage, DataSource and
// DataVolume, and deleting one under --on-delete delete leaves the others.
// A DataSource someone else made under a BaseImage's name is never taken
// over: the BaseImage says Conflict, naming the owner, until it is gone.
// A BaseImage made by hand under another name is left alone, and a tenant
// outside --tenants gets nothing.
func TestSyncerNamesAreInjectiveAndOwned(t *testing.T) {
	t.Parallel()
	testenv.RequireQEMU(t)
	hub := startTestHub(t, "hub-a")
	s := harness.ReserveSyncer(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{Gate: testenv.ImageGate, NotifyURL: s.WebhookURL, NotifyToken: webhookToken})

	// Someone else's DataSource, where foo--bar-latest's would go.
	foreign := &cdiv1.DataSource{
		ObjectMeta: metav1.ObjectMeta{Name: "foo--bar-latest", Namespace: "acme", Labels: map[string]string{"team": "web"}},
		Spec:       cdiv1.DataSourceSpec{Source: cdiv1.DataSourceSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: "acme", Name: "golden"}}},
	}
	hub.Create(t, foreign)
	// A BaseImage made by hand for acme/rhel:v1.0, not under the name the
	// syncer derives.
	handMade := &v1alpha1.BaseImage{
		ObjectMeta: metav1.ObjectMeta{Name: "rhel-v1-0", Namespace: "acme"},
		Spec:       v1alpha1.BaseImageSpec{Tenant: "acme", Repository: reg.Host + "/acme/rhel", Tag: "v1.0"},
	}
	hub.Create(t, handMade)
	startSyncer(t, s, hub, reg.Host, "--poll-interval", "1h", "--on-delete", "delete", "--tenants", "acme")

	type img struct{ repo, tag, digest, bi, dv string }
	imgs := []*img{{repo: "acme/rhel", tag: "v1.0"}, {repo: "acme/rhel", tag: "v1-0"}, {repo: "acme/rhel", tag: "v1_0"},
		{repo: "acme/foo", tag: "bar-latest"}, {repo: "acme/foo-bar", tag: "latest"}}
	names := map[string]bool{}
	for _, im := range imgs {
		im.digest = importImage(t, rawDisk(t, im.repo+":"+im.tag), reg.Host+"/"+im.repo+":"+im.tag).Digest
		im.bi, im.dv = cdi.BaseImageName(im.repo, im.tag), cdi.DataVolumeName(cdi.ImageName(im.repo), im.digest)
		if names[im.bi] {
			t.Fatalf("two images share the BaseImage name %s", im.bi)
		}
		names[im.bi] = true
	}
	// A tenant this hub does not serve: its notifications are dropped.
	importImage(t, rawDisk(t, "globex"), reg.Host+"/globex/rhel:9")
	for _, im := range imgs {
		// Any phase: the one in conflict with the foreign DataSource fails once CDI has imported it.
		hub.baseImage(t, "acme", im.bi, "importing its digest", func(b *v1alpha1.BaseImage) bool {
			return b.Spec.Repository == reg.Host+"/"+im.repo && b.Spec.Tag == im.tag && b.Status.ObservedDigest == im.digest
		})
		hub.CDI.WaitImported(t, "acme", im.dv, importTimeout)
	}
	for _, im := range imgs {
		if im.bi == foreign.Name {
			continue
		}
		hub.baseImage(t, "acme", im.bi, "ready", func(b *v1alpha1.BaseImage) bool {
			return b.Status.Phase == v1alpha1.PhaseReady && b.Status.DataSourceName == im.bi
		})
		hub.wantDataSourceOf(t, im.bi, reg.Host+"/"+im.repo, im.tag, im.dv)
	}

	// The foreign DataSource: a conflict on the BaseImage, the object untouched.
	bi := hub.baseImage(t, "acme", foreign.Name, "in conflict", func(b *v1alpha1.BaseImage) bool {
		c := meta.FindStatusCondition(b.Status.Conditions, v1alpha1.ConditionReady)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == "Conflict"
	})
	if c := meta.FindStatusCondition(bi.Status.Conditions, v1alpha1.ConditionReady); !strings.Contains(c.Message, "DataSource acme/foo--bar-latest belongs to someone other than image-syncer") {
		t.Errorf("conflict message %q does not name the DataSource and its owner", c.Message)
	}
	var ds cdiv1.DataSource
	if err := hub.Client.Get(t.Context(), client.ObjectKeyFromObject(foreign), &ds); err != nil {
		t.Fatal(err)
	}
	if ds.Spec.Source.PVC.Name != "golden" || ds.Labels[cdi.LabelManagedBy] != "" || ds.Labels["team"] != "web" {
		t.Errorf("the foreign DataSource was changed: %+v %v", ds.Spec.Source.PVC, ds.Labels)
	}
	// Once its owner deletes it, the BaseImage is served.
	if err := hub.Client.Delete(t.Context(), &ds); err != nil {
		t.Fatal(err)
	}
	foo := imgs[3]
	hub.baseImage(t, "acme", foo.bi, "ready once the foreign DataSource is gone", func(b *v1alpha1.BaseImage) bool { return b.Status.Phase == v1alpha1.PhaseReady })
	hub.wantDataSourceOf(t, foo.bi, reg.Host+"/"+foo.repo, foo.tag, foo.dv)

	// The hand-made BaseImage is marked and left alone.
	got := hub.baseImage(t, "acme", handMade.Name, "marked as not the syncer's", func(b *v1alpha1.BaseImage) bool {
		c := meta.FindStatusCondition(b.Status.Conditions, v1alpha1.ConditionReady)
		return c != nil && c.Reason == "UnexpectedName"
	})
	if got.Status.ObservedDigest != "" || got.Status.DataSourceName != "" {
		t.Errorf("the hand-made BaseImage was reconciled: %+v", got.Status)
	}

	// Deleting v1-0 and foo-bar:latest leaves the tags that once shared
	// their names alone.
	testenv.Run(t, testenv.Imagectl, "delete", "--force", reg.Host+"/acme/rhel:v1-0")
	testenv.Run(t, testenv.Imagectl, "delete", "--force", reg.Host+"/acme/foo-bar:latest")
	for _, gone := range []*img{imgs[1], imgs[4]} {
		waitFor(t, "BaseImage, DataSource and DataVolume of "+gone.repo+":"+gone.tag+" deleted", func() (bool, error) {
			biErr := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: "acme", Name: gone.bi}, &v1alpha1.BaseImage{})
			dsErr := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: "acme", Name: gone.bi}, &cdiv1.DataSource{})
			dvErr := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: "acme", Name: gone.dv}, &cdiv1.DataVolume{})
			return apierrors.IsNotFound(biErr) && apierrors.IsNotFound(dsErr) && apierrors.IsNotFound(dvErr), nil
		})
	}
	for _, kept := range []*img{imgs[0], imgs[2], imgs[3]} {
		b := hub.baseImage(t, "acme", kept.bi, "kept", func(*v1alpha1.BaseImage) bool { return true })
		if _, removed := b.Annotations[v1alpha1.AnnotationRemoved]; removed || b.Status.Phase != v1alpha1.PhaseReady {
			t.Errorf("%s:%s was touched by another tag's delete: phase %s, annotations %v", kept.repo, kept.tag, b.Status.Phase, b.Annotations)
		}
		hub.wantDataSourceOf(t, kept.bi, reg.Host+"/"+kept.repo, kept.tag, kept.dv)
	}
	var others v1alpha1.BaseImageList
	if err := hub.Client.List(t.Context(), &others, client.InNamespace("globex")); err != nil || len(others.Items) != 0 {
		t.Errorf("a tenant outside --tenants got BaseImages: %v %v", others.Items, err)
	}
}

// wantDataSourceOf checks that the DataSource name clones from pvc and
// records exactly repository and tag.
func (h *testHub) wantDataSourceOf(t *testing.T, name, repository, tag, pvc string) {
	t.Helper()
	var ds cdiv1.DataSource
	waitFor(t, h.Name+": DataSource "+name+" → "+pvc, func() (bool, error) {
		err := h.Client.Get(t.Context(), client.ObjectKey{Namespace: "acme", Name: name}, &ds)
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil && ds.Spec.Source.PVC != nil && ds.Spec.Source.PVC.Name == pvc, err
	})
	if ds.Annotations[cdi.AnnotationRepository] != repository || ds.Annotations[cdi.AnnotationTag] != tag || ds.Labels[cdi.LabelBaseImage] != name {
		t.Errorf("DataSource %s records %v %v, want %s:%s", name, ds.Labels, ds.Annotations, repository, tag)
	}
}

// TestSyncerNeverOverwritesAPullSecretOrCAItDidNotMake: a Secret or
// ConfigMap a tenant made under the names image-syncer copies the
// registry's pull credential and CA to is never changed: the BaseImage
// says whose object is in the way and nothing is imported, while the copy
// the syncer may make beside it (globex's pull secret) is made and
// labelled as the syncer's. acme's Secret stops the import before the CA;
// globex has no Secret of its own, so its import reaches the CA.
func TestSyncerNeverOverwritesAPullSecretOrCAItDidNotMake(t *testing.T) {
	t.Parallel()
	testenv.RequireQEMU(t)
	hub := startAPIHub(t, "hub-a")
	s := harness.ReserveSyncer(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{Gate: testenv.ImageGate, Username: "robot", Password: "pull-only", TLS: true, NotifyURL: s.WebhookURL, NotifyToken: webhookToken})
	dir, tenants := t.TempDir(), t.TempDir()
	writeDockerConfig(t, filepath.Join(dir, "config.json"), reg.Host, "robot", "pull-only")
	for _, tenant := range []string{"acme", "globex"} {
		writeDockerConfig(t, filepath.Join(tenants, tenant), reg.Host, "robot", "pull-only")
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: cdi.PullSecretName, Namespace: "acme", Labels: map[string]string{"owner": "acme"}},
		Data: map[string][]byte{"accessKeyId": []byte("acme-own"), "secretKey": []byte("acme-own-password")}}
	ca := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: cdi.CAConfigMapName, Namespace: "globex", Labels: map[string]string{"owner": "globex"}},
		Data: map[string]string{"ca.crt": "globex's own CA"}}
	hub.Create(t, secret)
	hub.Create(t, ca)
	s.Start(t, testenv.ImageSyncer, hub.SyncerHub, reg.Host, "--poll-interval", "1h", "--docker-config", filepath.Join(dir, "config.json"),
		"--tenant-credentials-dir", tenants, "--registry-ca-file", reg.CAFile)

	for _, tc := range []struct {
		ns   string
		mine client.Object
	}{{"acme", secret}, {"globex", ca}} {
		importImageWith(t, "pull-only", rawDisk(t, tc.ns+"'s disk"), reg.Host+"/"+tc.ns+"/rhel:9", "--username", "robot", "--password-stdin", "--ca-file", reg.CAFile)
		// The syncer either reports the object in its way or has changed it.
		inTheWay := tc.ns + "/" + tc.mine.GetName() + " exists and is not managed by the syncer"
		cur := tc.mine.DeepCopyObject().(client.Object)
		bi := hub.baseImage(t, tc.ns, "rhel--9", "stopped by "+tc.mine.GetName(), func(b *v1alpha1.BaseImage) bool {
			if err := hub.Client.Get(t.Context(), client.ObjectKeyFromObject(tc.mine), cur); err != nil {
				t.Fatal(err)
			}
			c := meta.FindStatusCondition(b.Status.Conditions, v1alpha1.ConditionProgressing)
			return cur.GetResourceVersion() != tc.mine.GetResourceVersion() || c != nil && strings.Contains(c.Message, inTheWay)
		})
		if cur.GetResourceVersion() != tc.mine.GetResourceVersion() { // any write changes it
			t.Errorf("%s/%s was written: resourceVersion %s, made at %s", tc.ns, tc.mine.GetName(), cur.GetResourceVersion(), tc.mine.GetResourceVersion())
		}
		if c := meta.FindStatusCondition(bi.Status.Conditions, v1alpha1.ConditionProgressing); c == nil || c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, inTheWay) {
			t.Errorf("BaseImage %s/rhel--9 Progressing %+v; want False, saying %q", tc.ns, c, inTheWay)
		}
		if dvs := hub.dataVolumes(t, tc.ns, "rhel"); len(dvs) != 0 {
			t.Errorf("%s: DataVolumes %v made without the syncer's copies", tc.ns, slices.Collect(maps.Keys(dvs)))
		}
	}
	var own corev1.Secret
	if err := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: "globex", Name: cdi.PullSecretName}, &own); err != nil || own.Labels[cdi.LabelManagedBy] != cdi.ManagedByValue {
		t.Errorf("globex's pull secret, which only the syncer made: labels %v (%v); want the syncer's", own.Labels, err)
	}
}
