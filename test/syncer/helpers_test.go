package syncer

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/imagepipe/imagepipe/pkg/api"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// TestMain builds imagectl and image-syncer unless the Makefile built
// them ($IMAGECTL, $IMAGE_SYNCER).
func TestMain(m *testing.M) { os.Exit(testenv.MainWithSyncer(m)) }

// webhookToken is what the registry sends the syncers' webhooks.
const webhookToken = harness.SyncerWebhookToken

// testHub is a hub prepared for the syncer (harness.StartSyncerHub): the
// BaseImage CRD, the syncer's RBAC from config/syncer bound to the hub user
// "syncer", the tenant namespaces acme and globex, and a default
// StorageClass whose StorageProfile is played for CDI.
type testHub struct {
	*harness.SyncerHub
}

// startTestHub starts a hub whose StorageProfile offers modes (default
// ReadWriteMany Block).
func startTestHub(t *testing.T, name string, modes ...cdiv1.ClaimPropertySet) *testHub {
	t.Helper()
	return &testHub{harness.StartSyncerHub(t, name, harness.SyncerHubOptions{Namespaces: []string{"acme", "globex"}, StorageModes: modes})}
}

// startAPIHub starts a hub like startTestHub but without CDI, for a test
// that needs only the API server: it needs no root.
func startAPIHub(t *testing.T, name string) *testHub {
	t.Helper()
	return &testHub{harness.StartSyncerHub(t, name, harness.SyncerHubOptions{Namespaces: []string{"acme", "globex"}, NoCDI: true})}
}

// startSyncer runs the image-syncer under test on hub (see harness.Syncer.Start) for a
// registry served over plain HTTP, which CDI's importer on the hub is allowed to pull from.
func startSyncer(t *testing.T, s *harness.Syncer, hub *testHub, registryHost string, args ...string) {
	t.Helper()
	if hub.CDI != nil {
		hub.CDI.AllowInsecureRegistry(t, registryHost)
	}
	s.Start(t, testenv.ImageSyncer, hub.SyncerHub, registryHost, args...)
}

// waitFor polls cond until it holds, failing the test after a minute.
func waitFor(t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	harness.WaitUntil(t, what, time.Minute, 50*time.Millisecond, cond)
}

// baseImage waits until the BaseImage of repository:tag on hub satisfies cond.
func (h *testHub) baseImage(t *testing.T, ns, name, what string, cond func(*v1alpha1.BaseImage) bool) *v1alpha1.BaseImage {
	t.Helper()
	var bi v1alpha1.BaseImage
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("hub %s: BaseImage %s/%s last seen: phase %q, status %+v", h.Name, ns, name, bi.Status.Phase, bi.Status.Conditions)
		}
	})
	waitFor(t, fmt.Sprintf("hub %s: BaseImage %s/%s %s", h.Name, ns, name, what), func() (bool, error) {
		err := h.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, &bi)
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil && cond(&bi), err
	})
	return &bi
}

// dataVolumes lists the DataVolumes of an image on hub, by name.
func (h *testHub) dataVolumes(t *testing.T, ns, image string) map[string]cdiv1.DataVolume {
	t.Helper()
	var list cdiv1.DataVolumeList
	if err := h.Client.List(t.Context(), &list, client.InNamespace(ns), client.MatchingLabels{"imagepipe.io/image": image}); err != nil {
		t.Fatal(err)
	}
	out := map[string]cdiv1.DataVolume{}
	for _, dv := range list.Items {
		out[dv.Name] = dv
	}
	return out
}

// rawDisk writes a small raw disk whose content, and so whose image
// digest, depends on seed.
func rawDisk(t *testing.T, seed string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "disk.raw")
	data := bytes.Repeat([]byte(seed), (1<<20)/len(seed)+1)[:1<<20]
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// importImage runs imagectl import and returns its result.
func importImage(t *testing.T, disk, ref string) api.ImportResult {
	t.Helper()
	return importImageWith(t, "", disk, ref)
}

// importImageWith runs imagectl import with extra flags, feeding stdin
// (e.g. a password for --password-stdin).
func importImageWith(t *testing.T, stdin, disk, ref string, flags ...string) api.ImportResult {
	t.Helper()
	r := testenv.RunCommand(t, testenv.Command{
		Name:  testenv.Imagectl,
		Args:  append([]string{"import", "--quiet", "-o", "json", disk, ref}, flags...),
		Env:   []string{"IMAGEPIPE_CACHE=" + t.TempDir()},
		Stdin: stdin,
	})
	if r.Code != 0 {
		t.Fatalf("imagectl import %s %s: exit %d\n%s", disk, ref, r.Code, r.Stderr)
	}
	var res api.ImportResult
	if err := json.Unmarshal([]byte(r.Stdout), &res); err != nil {
		t.Fatalf("import output %q: %v", r.Stdout, err)
	}
	return res
}

// writeDockerConfig writes a docker config.json with one registry credential.
func writeDockerConfig(t *testing.T, path, host, user, password string) {
	t.Helper()
	auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + password))
	if err := os.WriteFile(path, []byte(`{"auths":{"`+host+`":{"auth":"`+auth+`"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
}

// pickedUp reports whether the syncer has started importing the BaseImage's
// digest: it is Importing, or already Ready, since CDI's real importer may
// finish before a test looks.
func pickedUp(b *v1alpha1.BaseImage) bool {
	return b.Status.Phase == v1alpha1.PhaseImporting || b.Status.Phase == v1alpha1.PhaseReady
}

// waitReady waits until the syncer has picked up digest for the BaseImage
// ns/name, CDI's importer has imported it, and the BaseImage is Ready.
func (h *testHub) waitReady(t *testing.T, ns, name, digest string) {
	t.Helper()
	h.baseImage(t, ns, name, "importing", func(b *v1alpha1.BaseImage) bool {
		return b.Status.ObservedDigest == digest && pickedUp(b)
	})
	h.CDI.WaitImported(t, ns, dvName(digest), importTimeout)
	h.baseImage(t, ns, name, "ready", func(b *v1alpha1.BaseImage) bool { return b.Status.Phase == v1alpha1.PhaseReady })
}

// history holds every version of some objects that a watch delivered: states
// that last too briefly for polling to see (a DataVolume between two importer
// restarts, a condition overwritten a second later) are all in it, in order.
type history[T client.Object] struct {
	mu    sync.Mutex
	seen  []T
	ended bool // the watch ended before the test did
}

// watchHistory records the objects of list's kind in namespace ns on hub
// from now until the test ends.
func watchHistory[T client.Object](t *testing.T, h *testHub, list client.ObjectList, ns string) *history[T] {
	t.Helper()
	w, err := h.Client.Watch(t.Context(), list, client.InNamespace(ns))
	if err != nil {
		t.Fatalf("hub %s: watching %T: %v", h.Name, list, err)
	}
	hist := &history[T]{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for e := range w.ResultChan() {
			if o, ok := e.Object.(T); ok {
				hist.mu.Lock()
				hist.seen = append(hist.seen, o)
				hist.mu.Unlock()
			}
		}
		hist.mu.Lock()
		hist.ended = t.Context().Err() == nil
		hist.mu.Unlock()
	}()
	t.Cleanup(func() { w.Stop(); <-done })
	return hist
}

// versions returns what was seen so far, oldest first; a watch that ended
// early fails the test, since its history would be incomplete.
func (h *history[T]) versions(t *testing.T) []T {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ended {
		t.Fatalf("the watch of %T ended early: the history is incomplete", *new(T))
	}
	return slices.Clone(h.seen)
}
