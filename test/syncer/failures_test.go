package syncer

import (
	"archive/tar"
	"bytes"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/imagepipe/imagepipe/internal/cdi"
	"github.com/imagepipe/imagepipe/pkg/api"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// TestSyncerRejectsAnImagePushedByAnotherClient: a tenant pushes, with
// go-containerregistry instead of imagectl, a containerDisk whose qcow2
// names a backing file. Revalidation refuses it: the BaseImage says
// Rejected with the reason, and nothing is imported.
func TestSyncerRejectsAnImagePushedByAnotherClient(t *testing.T) {
	t.Parallel()
	testenv.RequireQEMU(t)
	hub := startTestHub(t, "hub-a")
	s := harness.ReserveSyncer(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{Gate: testenv.ImageGate, NotifyURL: s.WebhookURL, NotifyToken: webhookToken})
	startSyncer(t, s, hub, reg.Host, "--poll-interval", "1h")

	dir := t.TempDir()
	base, top := filepath.Join(dir, "base.qcow2"), filepath.Join(dir, "top.qcow2")
	testenv.Run(t, "qemu-img", "create", "-q", "-f", "qcow2", base, "16M")
	testenv.Run(t, "qemu-img", "create", "-q", "-f", "qcow2", "-b", base, "-F", "qcow2", top)
	pushContainerDisk(t, reg.Host+"/acme/sneaky:1", top)

	bi := hub.baseImage(t, "acme", "sneaky--1", "rejected", func(b *v1alpha1.BaseImage) bool {
		return b.Status.Phase == v1alpha1.PhaseRejected
	})
	c := meta.FindStatusCondition(bi.Status.Conditions, v1alpha1.ConditionRejected)
	if c == nil || c.Status != "True" || c.Reason != "BackingFile" || !strings.Contains(c.Message, "backing-file") {
		t.Errorf("Rejected condition %+v, want True with reason BackingFile", c)
	}
	if dvs := hub.dataVolumes(t, "acme", "sneaky"); len(dvs) != 0 {
		t.Errorf("a rejected image was imported: %v", dvs)
	}
}

// pushContainerDisk pushes disk as a containerDisk of the right shape,
// built with go-containerregistry rather than imagectl; opts add to the
// push (remote.WithAuth for a registry that needs credentials).
func pushContainerDisk(t *testing.T, ref, disk string, opts ...remote.Option) {
	t.Helper()
	data, err := os.ReadFile(disk)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range []*tar.Header{
		{Typeflag: tar.TypeDir, Name: api.DiskDir, Mode: 0o555, Uid: api.DiskUID, Gid: api.DiskUID},
		{Typeflag: tar.TypeReg, Name: api.DiskPath, Mode: 0o444, Uid: api.DiskUID, Gid: api.DiskUID, Size: int64(len(data))},
	} {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tw.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cfg.OS, cfg.Architecture = "linux", "amd64"
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		t.Fatal(err)
	}
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img, opts...); err != nil {
		t.Fatalf("pushing %s: %v", ref, err)
	}
}

// TestSyncerNeverDeletesWhileTheRegistryIsDown: with the registry killed,
// polls fail and nothing on the hub changes; once it is back, new tags sync
// again.
func TestSyncerNeverDeletesWhileTheRegistryIsDown(t *testing.T) {
	t.Parallel()
	testenv.RequireQEMU(t)
	hub := startTestHub(t, "hub-a")
	s := harness.ReserveSyncer(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{Gate: testenv.ImageGate, NotifyURL: s.WebhookURL, NotifyToken: webhookToken})
	startSyncer(t, s, hub, reg.Host, "--poll-interval", "1s", "--digest-resync-interval", "2s", "--on-delete", "delete")

	v1 := importImage(t, rawDisk(t, "before the outage"), reg.Host+"/acme/rhel:9")
	hub.waitReady(t, "acme", "rhel--9", v1.Digest)

	reg.Kill(t)
	// Until a full poll succeeds again every poll is a full one, which
	// also looks up every known tag: the kind of pass that could delete.
	failed := s.Metric(t, "imagepipe_syncer_polls_total", `kind="full"`, `result="error"`)
	waitFor(t, "two failed full polls", func() (bool, error) {
		return s.Metric(t, "imagepipe_syncer_polls_total", `kind="full"`, `result="error"`) >= failed+2, nil
	})
	bi := hub.baseImage(t, "acme", "rhel--9", "still there", func(*v1alpha1.BaseImage) bool { return true })
	if _, removed := bi.Annotations[v1alpha1.AnnotationRemoved]; removed || bi.Status.Phase != v1alpha1.PhaseReady {
		t.Errorf("while the registry was down the BaseImage became %s (annotations %v)", bi.Status.Phase, bi.Annotations)
	}
	if _, ok := hub.dataVolumes(t, "acme", "rhel")[dvName(v1.Digest)]; !ok {
		t.Error("the import was deleted while the registry was down")
	}

	reg.Restart(t)
	v2 := importImage(t, rawDisk(t, "after the outage"), reg.Host+"/acme/rhel:10")
	hub.baseImage(t, "acme", "rhel--10", "synced after the outage", func(b *v1alpha1.BaseImage) bool { return b.Status.ObservedDigest == v2.Digest })
	hub.baseImage(t, "acme", "rhel--9", "untouched", func(b *v1alpha1.BaseImage) bool {
		return b.Status.Phase == v1alpha1.PhaseReady && b.Annotations[v1alpha1.AnnotationRemoved] == ""
	})
}

// TestSyncerStopsRetryingAFailingImport: CDI's real importer keeps failing, because the
// registry refuses the pull credential of the tenant (the syncer's own credential works, so the
// image is found and checked). CDI restarts the importer pod; after three restarts the syncer
// counts a failed attempt, and after --max-attempts attempts it stops, says why, and leaves no
// DataVolume behind for CDI to retry forever.
func TestSyncerStopsRetryingAFailingImport(t *testing.T) {
	t.Parallel()
	testenv.RequireQEMU(t)
	hub, reg := startSyncerWithRevokedTenantCredential(t)

	dvHistory := watchHistory[*cdiv1.DataVolume](t, hub, &cdiv1.DataVolumeList{}, "acme")
	biHistory := watchHistory[*v1alpha1.BaseImage](t, hub, &v1alpha1.BaseImageList{}, "acme")
	v1 := importImageWith(t, "pull-only", rawDisk(t, "never imports"), reg.Host+"/acme/rhel:9", "--username", "robot", "--password-stdin")
	bi := &v1alpha1.BaseImage{}
	harness.WaitUntil(t, "the BaseImage failed after 2 attempts", importTimeout, 100*time.Millisecond, func() (bool, error) {
		err := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: "acme", Name: "rhel--9"}, bi)
		return err == nil && bi.Status.Phase == v1alpha1.PhaseFailed, client.IgnoreNotFound(err)
	})
	c := meta.FindStatusCondition(bi.Status.Conditions, v1alpha1.ConditionProgressing)
	if c == nil || c.Status != "False" || c.Reason != "RetriesExhausted" || bi.Status.Attempts != 2 {
		t.Errorf("attempts %d, Progressing condition %+v, want 2 and False with reason RetriesExhausted", bi.Status.Attempts, c)
	}
	waitFor(t, "no DataVolume left", func() (bool, error) { return len(hub.dataVolumes(t, "acme", "rhel")) == 0, nil })

	// Each attempt had a DataVolume of its own, the second made at least
	// the retry delay (1 s) after the first failed.
	var attempts []*cdiv1.DataVolume // the first version of each DataVolume
	uids := map[types.UID]bool{}
	for _, d := range dvHistory.versions(t) {
		if d.Name == dvName(v1.Digest) && !uids[d.UID] {
			uids[d.UID] = true
			attempts = append(attempts, d)
		}
	}
	var firstFailure *metav1.Time
	var passedOn bool // the reason CDI's importer gave reached the BaseImage
	for _, b := range biHistory.versions(t) {
		if b.Name != "rhel--9" || b.Status.Attempts != 1 {
			continue
		}
		if firstFailure == nil {
			firstFailure = b.Status.LastFailure
		}
		c := meta.FindStatusCondition(b.Status.Conditions, v1alpha1.ConditionProgressing)
		passedOn = passedOn || c != nil && c.Reason == "Retrying" && strings.Contains(c.Message, "authentication required")
	}
	switch {
	case len(attempts) != 2:
		t.Errorf("%d DataVolumes made for the digest, want one for each of 2 attempts", len(attempts))
	case firstFailure == nil:
		t.Error("no BaseImage version counted the first failure")
	case attempts[1].CreationTimestamp.Before(&metav1.Time{Time: firstFailure.Add(time.Second)}):
		t.Errorf("attempt 2 started at %s, before the 1 s retry delay after the failure at %s", attempts[1].CreationTimestamp, firstFailure)
	}
	if !passedOn {
		t.Error("no Progressing condition passed on why CDI's importer failed (authentication required)")
	}

	// The annotation the condition names starts the imports over.
	patch := client.MergeFrom(bi.DeepCopy())
	bi.Annotations[v1alpha1.AnnotationRetry] = "now"
	seen := len(biHistory.versions(t))
	if err := hub.Client.Patch(t.Context(), bi, patch); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the imports starting over: the annotation gone, no attempts counted, a third DataVolume", func() (bool, error) {
		restarted := false
		for _, b := range biHistory.versions(t)[seen:] {
			_, annotated := b.Annotations[v1alpha1.AnnotationRetry]
			restarted = restarted || b.Name == "rhel--9" && !annotated && b.Status.Phase == v1alpha1.PhaseImporting && b.Status.Attempts == 0
		}
		uids := map[types.UID]bool{}
		for _, d := range dvHistory.versions(t) {
			uids[d.UID] = true
		}
		return restarted && len(uids) == 3, nil
	})
}

// TestSyncerTakesHarborQuayAndZotWebhooks: payloads in the shape Harbor,
// Quay and zot send, posted to the running syncer, each make a BaseImage
// (the registry itself notifies nobody here). Quay names no digest: the
// syncer resolves the tag.
func TestSyncerTakesHarborQuayAndZotWebhooks(t *testing.T) {
	t.Parallel()
	testenv.RequireQEMU(t)
	hub := startTestHub(t, "hub-a")
	s := harness.ReserveSyncer(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{Gate: testenv.ImageGate})
	startSyncer(t, s, hub, reg.Host, "--poll-interval", "1h")

	harbor := importImage(t, rawDisk(t, "harbor"), reg.Host+"/acme/from-harbor:1")
	quay := importImage(t, rawDisk(t, "quay"), reg.Host+"/acme/from-quay:1")
	zot := importImage(t, rawDisk(t, "zot"), reg.Host+"/acme/from-zot:1")
	for _, d := range []struct {
		url    string
		header http.Header
		body   string
	}{
		{s.WebhookURL, http.Header{"Authorization": {"Bearer " + webhookToken}, "Content-Type": {"application/json"}},
			`{"type":"PUSH_ARTIFACT","occur_at":1763800000,"operator":"ci","event_data":{"resources":[{"digest":"` + harbor.Digest + `","tag":"1","resource_url":"` + reg.Host + `/acme/from-harbor:1"}],"repository":{"name":"from-harbor","namespace":"acme","repo_full_name":"acme/from-harbor","repo_type":"private"}}}`},
		{s.WebhookURL + "?token=" + webhookToken, http.Header{"Content-Type": {"application/json"}},
			`{"repository":"acme/from-quay","namespace":"acme","name":"from-quay","docker_url":"` + reg.Host + `/acme/from-quay","homepage":"https://quay.example.com/repository/acme/from-quay","updated_tags":["1"]}`},
		{s.WebhookURL, http.Header{"Authorization": {"Bearer " + webhookToken}, "Content-Type": {"application/json"},
			"Ce-Specversion": {"1.0"}, "Ce-Id": {"1"}, "Ce-Source": {"zotregistry.dev"}, "Ce-Type": {"zotregistry.image.updated"}},
			`{"name":"acme/from-zot","reference":"1","digest":"` + zot.Digest + `","mediaType":"application/vnd.oci.image.manifest.v1+json"}`},
	} {
		req, _ := http.NewRequest(http.MethodPost, d.url, strings.NewReader(d.body))
		req.Header = d.header
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("posting %.40s: status %d", d.body, resp.StatusCode)
		}
	}
	for image, digest := range map[string]string{"from-harbor": harbor.Digest, "from-quay": quay.Digest, "from-zot": zot.Digest} {
		hub.baseImage(t, "acme", cdi.BaseImageName("acme/"+image, "1"), "at the pushed digest", func(b *v1alpha1.BaseImage) bool {
			return b.Spec.Digest == digest && b.Status.ObservedDigest == digest
		})
	}
	if got := s.Metric(t, "imagepipe_syncer_events_total", `source="quay"`, `result="received"`); got != 1 {
		t.Errorf("quay events received: %v, want 1", got)
	}
}

// startSyncerWithRevokedTenantCredential starts a hub, a registry with one
// user, robot, and a syncer (at most 2 attempts a digest, 1 s apart) that
// checks images with robot's credential but hands CDI's importer acme's
// own, which the registry refuses: every import of acme's images fails.
func startSyncerWithRevokedTenantCredential(t *testing.T) (*testHub, *harness.Registry) {
	t.Helper()
	hub := startTestHub(t, "hub-a")
	s := harness.ReserveSyncer(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{Gate: testenv.ImageGate, Username: "robot", Password: "pull-only", NotifyURL: s.WebhookURL, NotifyToken: webhookToken})
	dir := t.TempDir()
	syncerConfig, tenantDir := filepath.Join(dir, "config.json"), filepath.Join(dir, "tenants")
	writeDockerConfig(t, syncerConfig, reg.Host, "robot", "pull-only")
	if err := os.Mkdir(tenantDir, 0o700); err != nil {
		t.Fatal(err)
	}
	writeDockerConfig(t, filepath.Join(tenantDir, "acme"), reg.Host, "robot", "revoked")
	startSyncer(t, s, hub, reg.Host, "--poll-interval", "1h", "--max-attempts", "2", "--retry-delay", "1s",
		"--docker-config", syncerConfig, "--tenant-credentials-dir", tenantDir)
	return hub, reg
}
