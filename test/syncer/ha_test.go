package syncer

import (
	"fmt"
	"testing"
	"time"

	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/imagepipe/imagepipe/internal/cdi"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// apiserverOutage is how long TestSyncerConvergesAcrossAnAPIServerRestart
// keeps the apiserver away: longer than a 10 s renew deadline, within the
// syncer's 40 s.
const apiserverOutage = 15 * time.Second

// reconnectBound is how long the syncer may take to converge after the
// outage: client-go's reflector backoff (at most 60 s) plus the work.
const reconnectBound = 2 * time.Minute

// TestSyncerConvergesAcrossAnAPIServerRestart: the hub's apiserver restarts
// while the syncer works through a burst of pushes, and stays away for
// apiserverOutage. The syncer keeps its lease and converges: every tag
// gets its BaseImage and exactly one DataVolume per digest. Convergence may
// take up to reconnectBound: client-go's watches back off up to 30 s, with
// as much jitter, while the apiserver is away or still syncing its RBAC.
func TestSyncerConvergesAcrossAnAPIServerRestart(t *testing.T) {
	t.Parallel()
	testenv.RequireQEMU(t)
	hub := startTestHub(t, "hub-a")
	s := harness.ReserveSyncer(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{Gate: testenv.ImageGate, NotifyURL: s.WebhookURL, NotifyToken: webhookToken})
	startSyncer(t, s, hub, reg.Host, "--poll-interval", "1s")

	const n = 8
	digests := map[string]string{} // tag -> digest
	for i := range n {
		tag := fmt.Sprint(i)
		digests[tag] = importImage(t, rawDisk(t, "burst "+tag), reg.Host+"/acme/rhel:"+tag).Digest
		if i == n/2 {
			hub.RestartAPIServer(t, apiserverOutage)
		}
	}
	behind := map[string]string{} // BaseImage name -> phase, of those not yet importing their digest
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("BaseImages behind, with their phases: %v", behind)
		}
	})
	harness.WaitUntil(t, "every BaseImage importing its digest", reconnectBound, 100*time.Millisecond, func() (bool, error) {
		clear(behind)
		for tag, digest := range digests {
			var bi v1alpha1.BaseImage
			err := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: "acme", Name: cdi.BaseImageName("acme/rhel", tag)}, &bi)
			if client.IgnoreNotFound(err) != nil {
				return false, err
			}
			if bi.Status.ObservedDigest != digest || !pickedUp(&bi) {
				behind[bi.Name] = string(bi.Status.Phase)
			}
		}
		return len(behind) == 0, nil
	})
	var list cdiv1.DataVolumeList
	if err := hub.Client.List(t.Context(), &list, client.InNamespace("acme")); err != nil {
		t.Fatal(err)
	}
	perURL := map[string]int{}
	for _, dv := range list.Items {
		perURL[*dv.Spec.Source.Registry.URL]++
	}
	if len(list.Items) != n || len(perURL) != n {
		t.Errorf("%d DataVolumes for %d digests (%v), want exactly one each", len(list.Items), n, perURL)
	}
	var bis v1alpha1.BaseImageList
	if err := hub.Client.List(t.Context(), &bis, client.InNamespace("acme")); err != nil || len(bis.Items) != n {
		t.Errorf("%d BaseImages for %d tags (%v)", len(bis.Items), n, err)
	}
}

// TestSyncerReplicasShareTheWorkThroughLeaderElection: two replicas on one
// hub, both notified by the registry. One leads; when it stops, the other
// takes over and syncs the next push.
func TestSyncerReplicasShareTheWorkThroughLeaderElection(t *testing.T) {
	t.Parallel()
	testenv.RequireQEMU(t)
	hub := startTestHub(t, "hub-a")
	r1, r2 := harness.ReserveSyncer(t), harness.ReserveSyncer(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{Gate: testenv.ImageGate, NotifyURL: r1.WebhookURL, NotifyURLs: []string{r2.WebhookURL}, NotifyToken: webhookToken})
	startSyncer(t, r1, hub, reg.Host, "--poll-interval", "1h")
	startSyncer(t, r2, hub, reg.Host, "--poll-interval", "1h")

	leader := func() (*harness.Syncer, *harness.Syncer) {
		var l, f *harness.Syncer
		waitFor(t, "one leader", func() (bool, error) {
			m1 := r1.Metric(t, "leader_election_master_status")
			m2 := r2.Metric(t, "leader_election_master_status")
			switch {
			case m1 == 1 && m2 == 0:
				l, f = r1, r2
			case m2 == 1 && m1 == 0:
				l, f = r2, r1
			}
			return l != nil, nil
		})
		return l, f
	}
	lead, follow := leader()

	v1 := importImage(t, rawDisk(t, "led by one"), reg.Host+"/acme/rhel:9")
	hub.baseImage(t, "acme", "rhel--9", "importing v1", func(b *v1alpha1.BaseImage) bool { return b.Status.ObservedDigest == v1.Digest })
	if got := follow.Metric(t, "controller_runtime_reconcile_total", `controller="baseimage"`); got != 0 {
		t.Errorf("the follower reconciled %v times", got)
	}

	lead.Stop(t) // releases the lease on the way out
	waitFor(t, "the follower leads", func() (bool, error) {
		return follow.Metric(t, "leader_election_master_status") == 1, nil
	})
	v2 := importImage(t, rawDisk(t, "led by the other"), reg.Host+"/acme/rhel:9")
	hub.baseImage(t, "acme", "rhel--9", "importing v2", func(b *v1alpha1.BaseImage) bool {
		return b.Status.ObservedDigest == v2.Digest && pickedUp(b)
	})
}
