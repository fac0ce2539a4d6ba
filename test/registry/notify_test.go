package registry

import (
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/imagepipe/imagepipe/internal/intake"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// TestDistributionNotificationsReachTheWebhook: the real registry, configured
// to notify the syncer's webhook with a bearer token, announces an import as
// one push event carrying the repository, the tag and the manifest digest.
func TestDistributionNotificationsReachTheWebhook(t *testing.T) {
	testenv.RequireQEMU(t)
	var mu sync.Mutex
	var events []intake.Event
	h, err := intake.NewWebhookHandler("hook-token", func(ev []intake.Event) {
		mu.Lock()
		events = append(events, ev...)
		mu.Unlock()
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	hook := httptest.NewServer(h)
	t.Cleanup(hook.Close)
	reg := harness.StartRegistry(t, harness.RegistryOptions{NotifyURL: hook.URL, NotifyToken: "hook-token"})

	qcow := makeDisk(t, t.TempDir(), 16, 2, "qcow2")
	res := importOK(t, t.TempDir(), qcow, reg.Host+"/acme/notified:1")

	// Notifications are sent asynchronously; wait for ours, bounded.
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		var found *intake.Event
		for i, e := range events {
			if e.Tag == "1" {
				found = &events[i]
			}
		}
		mu.Unlock()
		if found != nil {
			if found.Action != intake.ActionPush || found.Repository != "acme/notified" || found.Digest != res.Digest {
				t.Errorf("event %+v, want a push of acme/notified:1 at %s", *found, res.Digest)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no push event for the tag within 30 s; got %+v", events)
		}
		waitABit()
	}
}
