package syncer

import (
	"testing"

	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// TestATagFloodWithCraneStopsAtTheBound: a tenant adds tags with crane,
// each one manifest PUT of an image the registry already holds. image-syncer
// --max-images-per-tenant 2 gives the first two tags BaseImages and turns
// the third away with a warning, and another tenant's push still syncs.
func TestATagFloodWithCraneStopsAtTheBound(t *testing.T) {
	t.Parallel()
	hub := startAPIHub(t, "hub-a")
	s := harness.ReserveSyncer(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{NotifyURL: s.WebhookURL, NotifyToken: webhookToken})
	startSyncer(t, s, hub, reg.Host, "--poll-interval", "1h", "--max-images-per-tenant", "2")

	importImage(t, rawDisk(t, "one image, many tags"), reg.Host+"/acme/base:1")
	hub.baseImage(t, "acme", "base--1", "created", func(*v1alpha1.BaseImage) bool { return true })
	crane := harness.Binary(t, "crane")
	testenv.Run(t, crane, "tag", "--insecure", reg.Host+"/acme/base:1", "2")
	hub.baseImage(t, "acme", "base--2", "created", func(*v1alpha1.BaseImage) bool { return true })
	testenv.Run(t, crane, "tag", "--insecure", reg.Host+"/acme/base:1", "3")
	waitLogLine(t, s, "event not applied: the tenant has as many BaseImages as this hub allows (--max-images-per-tenant)", "tag=3", "tenant=acme", "limit=2")

	importImage(t, rawDisk(t, "another tenant"), reg.Host+"/globex/base:1")
	hub.baseImage(t, "globex", "base--1", "created", func(*v1alpha1.BaseImage) bool { return true })
	var list v1alpha1.BaseImageList
	if err := hub.Client.List(t.Context(), &list); err != nil {
		t.Fatal(err)
	}
	for _, bi := range list.Items {
		if bi.Name == "base--3" {
			t.Errorf("acme/base:3 got BaseImage %s/%s beyond acme's bound of 2", bi.Namespace, bi.Name)
		}
	}
}
