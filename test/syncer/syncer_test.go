package syncer

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/imagepipe/imagepipe/internal/cdi"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

func dvName(digest string) string { return cdi.DataVolumeName("rhel", digest) }

// TestSyncerReplicatesOntoTwoHubs follows one tag through its life on two
// hubs, each with its own syncer notified by the real registry:
// hub A learns from webhooks only (its poll interval is an hour), keeps two
// imports and retains on delete; hub B also polls every second, keeps one
// import and deletes on delete.
func TestSyncerReplicatesOntoTwoHubs(t *testing.T) {
	t.Parallel()
	testenv.RequireQEMU(t)
	hubA, hubB := startTestHub(t, "hub-a"), startTestHub(t, "hub-b")
	sa, sb := harness.ReserveSyncer(t), harness.ReserveSyncer(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{Gate: testenv.ImageGate, NotifyURL: sa.WebhookURL, NotifyURLs: []string{sb.WebhookURL}, NotifyToken: webhookToken})
	startSyncer(t, sa, hubA, reg.Host, "--poll-interval", "1h")
	startSyncer(t, sb, hubB, reg.Host, "--poll-interval", "1s", "--digest-resync-interval", "1s", "--keep", "1", "--on-delete", "delete")
	hubs := []*testHub{hubA, hubB}
	const ns, bi = "acme", "rhel--9"

	// 1. An import appears on both hubs as a BaseImage and a digest-pinned,
	// ReadWriteMany Block DataVolume.
	v1 := importImage(t, rawDisk(t, "version one"), reg.Host+"/acme/rhel:9")
	for _, h := range hubs {
		got := h.baseImage(t, ns, bi, "importing v1", func(b *v1alpha1.BaseImage) bool {
			return pickedUp(b) && b.Status.ObservedDigest == v1.Digest
		})
		if got.Spec.Repository != reg.Host+"/acme/rhel" || got.Spec.Tenant != "acme" || got.Spec.Tag != "9" {
			t.Errorf("hub %s: spec %+v", h.Name, got.Spec)
		}
		if !meta.IsStatusConditionTrue(got.Status.Conditions, v1alpha1.ConditionLiveMigratable) {
			t.Errorf("hub %s: LiveMigratable not True: %+v", h.Name, got.Status.Conditions)
		}
		dv := h.dataVolumes(t, ns, "rhel")[dvName(v1.Digest)]
		if dv.Name == "" {
			t.Fatalf("hub %s: no DataVolume %s", h.Name, dvName(v1.Digest))
		}
		if url := *dv.Spec.Source.Registry.URL; url != "docker://"+reg.Host+"/acme/rhel@"+v1.Digest {
			t.Errorf("hub %s: DataVolume URL %q is not pinned to the digest", h.Name, url)
		}
		if dv.Spec.Storage.AccessModes[0] != corev1.ReadWriteMany || *dv.Spec.Storage.VolumeMode != corev1.PersistentVolumeBlock {
			t.Errorf("hub %s: DataVolume storage %v %v, want ReadWriteMany Block", h.Name, dv.Spec.Storage.AccessModes, *dv.Spec.Storage.VolumeMode)
		}
	}

	// 2. Once CDI finished, the DataSource serves the import.
	for _, h := range hubs {
		h.CDI.WaitImported(t, ns, dvName(v1.Digest), importTimeout)
		h.baseImage(t, ns, bi, "ready at v1", func(b *v1alpha1.BaseImage) bool {
			return b.Status.Phase == v1alpha1.PhaseReady && b.Status.ImportedDigest == v1.Digest &&
				meta.IsStatusConditionTrue(b.Status.Conditions, v1alpha1.ConditionReady)
		})
		h.wantDataSource(t, ns, bi, dvName(v1.Digest))
	}

	// 3. A re-push of the tag starts a new import; the DataSource keeps
	// serving v1 until CDI says v2 succeeded, then switches. The nodes take
	// no pod until the test has looked, so v2's import waits for them.
	for _, h := range hubs {
		h.CDI.Node.Pause()
	}
	v2 := importImage(t, rawDisk(t, "version two"), reg.Host+"/acme/rhel:9")
	for _, h := range hubs {
		h.baseImage(t, ns, bi, "importing v2", func(b *v1alpha1.BaseImage) bool {
			return b.Status.ObservedDigest == v2.Digest && b.Status.Phase == v1alpha1.PhaseImporting
		})
		if _, ok := h.dataVolumes(t, ns, "rhel")[dvName(v2.Digest)]; !ok {
			t.Fatalf("hub %s: no DataVolume for v2", h.Name)
		}
		h.wantDataSource(t, ns, bi, dvName(v1.Digest))
		h.CDI.Node.Resume()
		h.CDI.WaitImported(t, ns, dvName(v2.Digest), importTimeout)
		h.baseImage(t, ns, bi, "ready at v2", func(b *v1alpha1.BaseImage) bool {
			return b.Status.Phase == v1alpha1.PhaseReady && b.Status.ImportedDigest == v2.Digest
		})
		h.wantDataSource(t, ns, bi, dvName(v2.Digest))
	}
	// Hub B keeps one import: v1's DataVolume and PVC go. Hub A keeps two.
	waitFor(t, "hub-b: v1 collected", func() (bool, error) {
		_, dvLeft := hubB.dataVolumes(t, ns, "rhel")[dvName(v1.Digest)]
		return !dvLeft && !hubB.pvcExists(t, ns, dvName(v1.Digest)), nil
	})
	if dvs := hubA.dataVolumes(t, ns, "rhel"); len(dvs) != 2 {
		t.Errorf("hub-a keeps %d DataVolumes, want 2", len(dvs))
	}

	// 4. A third version: hub A now drops v1 and keeps v2 and v3.
	v3 := importImage(t, rawDisk(t, "version three"), reg.Host+"/acme/rhel:9")
	for _, h := range hubs {
		h.baseImage(t, ns, bi, "importing v3", func(b *v1alpha1.BaseImage) bool { return b.Status.ObservedDigest == v3.Digest })
		waitFor(t, h.Name+": DataVolume for v3", func() (bool, error) {
			_, ok := h.dataVolumes(t, ns, "rhel")[dvName(v3.Digest)]
			return ok, nil
		})
		h.CDI.WaitImported(t, ns, dvName(v3.Digest), importTimeout)
		h.baseImage(t, ns, bi, "ready at v3", func(b *v1alpha1.BaseImage) bool { return b.Status.ImportedDigest == v3.Digest })
	}
	waitFor(t, "hub-a: v1 collected, v2 and v3 kept", func() (bool, error) {
		dvs := hubA.dataVolumes(t, ns, "rhel")
		_, has1 := dvs[dvName(v1.Digest)]
		_, has2 := dvs[dvName(v2.Digest)]
		return !has1 && has2 && len(dvs) == 2, nil
	})

	// 5. A webhook with a wrong token is refused and changes nothing.
	body := `{"events":[{"action":"push","target":{"repository":"acme/intruder","tag":"1","digest":"sha256:` + strings.Repeat("ab", 32) + `","mediaType":"application/vnd.oci.image.manifest.v1+json"}}]}`
	for _, h := range []*harness.Syncer{sa, sb} {
		req, _ := http.NewRequest(http.MethodPost, h.WebhookURL, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer wrong-token")
		req.Header.Set("Content-Type", "application/vnd.docker.distribution.events.v2+json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("wrong token: status %d, want 401", resp.StatusCode)
		}
	}

	// 6. The tag is deleted: hub A retains the current import and its
	// DataSource; hub B deletes everything of the tag.
	testenv.Run(t, testenv.Imagectl, "delete", "--force", reg.Host+"/acme/rhel:9")
	hubA.baseImage(t, ns, bi, "marked deleted", func(b *v1alpha1.BaseImage) bool { return b.Status.Phase == v1alpha1.PhaseDeleted })
	hubA.wantDataSource(t, ns, bi, dvName(v3.Digest))
	waitFor(t, "hub-b: BaseImage, DataSource and imports deleted", func() (bool, error) {
		err := hubB.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: bi}, &v1alpha1.BaseImage{})
		dsErr := hubB.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: bi}, &cdiv1.DataSource{})
		return apierrors.IsNotFound(err) && apierrors.IsNotFound(dsErr) && len(hubB.dataVolumes(t, ns, "rhel")) == 0, nil
	})
	// The refused webhook named acme/intruder; it never became a BaseImage.
	for _, h := range hubs {
		var list v1alpha1.BaseImageList
		if err := h.Client.List(t.Context(), &list, client.MatchingLabels{cdi.LabelImage: "intruder"}); err != nil || len(list.Items) != 0 {
			t.Errorf("hub %s: the unauthenticated push left BaseImages %v (%v)", h.Name, list.Items, err)
		}
	}
}

// wantDataSource checks that the DataSource name exists and clones from pvc.
func (h *testHub) wantDataSource(t *testing.T, ns, name, pvc string) {
	t.Helper()
	var ds cdiv1.DataSource
	waitFor(t, h.Name+": DataSource "+name+" → "+pvc, func() (bool, error) {
		err := h.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, &ds)
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil && ds.Spec.Source.PVC != nil, err
	})
	if got := ds.Spec.Source.PVC.Name; got != pvc {
		t.Fatalf("hub %s: DataSource %s clones from %s, want %s", h.Name, name, got, pvc)
	}
	if ds.Labels[cdi.LabelTenant] != "acme" || ds.Labels[cdi.LabelImage] != "rhel" || !strings.HasPrefix(strings.TrimPrefix(pvc, "rhel--"), ds.Labels[cdi.LabelDigest]) {
		t.Errorf("hub %s: DataSource labels %v", h.Name, ds.Labels)
	}
}

// pvcExists reports whether the PVC exists and its deletion was not
// requested. The apiserver's pvc-protection admission puts a finalizer on
// every PVC that only kube-controller-manager removes, and none runs here:
// a deleted PVC stays, with a deletion timestamp.
func (h *testHub) pvcExists(t *testing.T, ns, name string) bool {
	t.Helper()
	var pvc corev1.PersistentVolumeClaim
	err := h.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, &pvc)
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	return err == nil && pvc.DeletionTimestamp.IsZero()
}

// TestDataSourceSwitchesOnlyAfterTheImportSucceeded: a re-pushed tag is
// imported while its DataSource goes on serving the old import, and no
// version of the DataSource points at the new import's PVC before CDI
// reports that import's DataVolume Succeeded. Every version of the
// DataSource the hub stores is watched as it comes, and the DataVolume it
// points at is read then; the node takes no pod until the new import's
// DataVolume exists, so the import spends a while before Succeeded, which
// the test checks it saw.
func TestDataSourceSwitchesOnlyAfterTheImportSucceeded(t *testing.T) {
	t.Parallel()
	testenv.RequireQEMU(t)
	hub := startTestHub(t, "hub-a")
	s := harness.ReserveSyncer(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{Gate: testenv.ImageGate, NotifyURL: s.WebhookURL, NotifyToken: webhookToken})
	startSyncer(t, s, hub, reg.Host, "--poll-interval", "1h")
	const ns, bi = "acme", "rhel--9"
	v1 := importImage(t, rawDisk(t, "version one"), reg.Host+"/acme/rhel:9")
	hub.waitReady(t, ns, bi, v1.Digest)
	hub.wantDataSource(t, ns, bi, dvName(v1.Digest))

	// What each version of the DataSource pointed at, and the phase of that
	// import's DataVolume when the version was seen.
	type seen struct{ pvc, phase string }
	var (
		mu       sync.Mutex
		versions []seen
		failure  error
	)
	w, err := hub.Client.Watch(t.Context(), &cdiv1.DataSourceList{}, client.InNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for e := range w.ResultChan() {
			ds, ok := e.Object.(*cdiv1.DataSource)
			if !ok || ds.Name != bi || ds.Spec.Source.PVC == nil {
				continue
			}
			var dv cdiv1.DataVolume
			err := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: ds.Spec.Source.PVC.Name}, &dv)
			mu.Lock()
			if err != nil && failure == nil {
				failure = fmt.Errorf("reading the DataVolume %s the DataSource points at: %w", ds.Spec.Source.PVC.Name, err)
			}
			versions = append(versions, seen{ds.Spec.Source.PVC.Name, string(dv.Status.Phase)})
			mu.Unlock()
		}
	}()
	t.Cleanup(func() { w.Stop(); <-done })
	history := watchHistory[*cdiv1.DataVolume](t, hub, &cdiv1.DataVolumeList{}, ns)

	hub.CDI.Node.Pause()
	v2 := importImage(t, rawDisk(t, "version two"), reg.Host+"/acme/rhel:9")
	waitFor(t, "the DataVolume of v2", func() (bool, error) {
		_, ok := hub.dataVolumes(t, ns, "rhel")[dvName(v2.Digest)]
		return ok, nil
	})
	hub.CDI.Node.Resume()
	hub.CDI.WaitImported(t, ns, dvName(v2.Digest), importTimeout)
	waitFor(t, "the DataSource switched to v2", func() (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		return len(versions) > 0 && versions[len(versions)-1].pvc == dvName(v2.Digest), failure
	})

	mu.Lock()
	defer mu.Unlock()
	for _, v := range versions {
		if v.pvc != dvName(v1.Digest) && v.phase != string(cdiv1.Succeeded) {
			t.Errorf("the DataSource pointed at %s while its DataVolume was %q, not Succeeded (versions seen: %+v)", v.pvc, v.phase, versions)
			break
		}
	}
	var before []string // the phases v2's import went through before Succeeded
	for _, dv := range history.versions(t) {
		if dv.Name == dvName(v2.Digest) && dv.Status.Phase != cdiv1.Succeeded {
			before = append(before, string(dv.Status.Phase))
		}
	}
	if len(before) == 0 {
		t.Errorf("v2's DataVolume was never seen before it Succeeded: the test watched no import")
	}
}
