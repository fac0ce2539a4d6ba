package hub

import (
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/imagepipe/imagepipe/internal/cdi"
	"github.com/imagepipe/imagepipe/internal/hub"
	"github.com/imagepipe/imagepipe/internal/intake"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
	"github.com/imagepipe/imagepipe/test/harness"
)

// TestATagFloodStopsAtTheTenantsLimit: a tag costs a tenant one small
// manifest (crane tag, or a manifest PUT with mounted blobs) and costs
// every hub a BaseImage, its reconciles and status writes. Past
// --max-images-per-tenant a tenant's new tags get no BaseImage, the event
// is not retried, tags it already has still follow pushes, and other
// tenants are not affected; once a BaseImage goes, a new tag fits again
// (within a second: a tenant at the bound is not counted at every tag).
func TestATagFloodStopsAtTheTenantsLimit(t *testing.T) {
	t.Parallel()
	cluster := harness.StartSyncerHub(t, "hub-a", harness.SyncerHubOptions{Namespaces: []string{"acme", "globex"}, NoCDI: true})
	reg, tenancy := applierParts(t)
	clock := time.Now()
	applier := &hub.Applier{Client: cluster.Client, Registry: reg, Tenancy: tenancy, MaxImagesPerTenant: 2, Now: func() time.Time { return clock }}
	d1, d2 := "sha256:"+strings.Repeat("1", 64), "sha256:"+strings.Repeat("2", 64)
	push := func(repo, tag, digest string) {
		t.Helper()
		if err := applier.Apply(t.Context(), intake.Event{Action: intake.ActionPush, Repository: repo, Tag: tag, Digest: digest}); err != nil {
			t.Errorf("push %s:%s: %v, want nil (an event over the limit is not retried)", repo, tag, err)
		}
	}
	get := func(ns, repo, tag string) (*v1alpha1.BaseImage, bool) {
		t.Helper()
		var bi v1alpha1.BaseImage
		err := cluster.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: cdi.BaseImageName(repo, tag)}, &bi)
		if client.IgnoreNotFound(err) != nil {
			t.Fatal(err)
		}
		return &bi, err == nil
	}

	push("acme/rhel", "9", d1)
	push("acme/rhel", "10", d1)
	push("acme/rhel", "11", d1)
	if _, ok := get("acme", "acme/rhel", "11"); ok {
		t.Errorf("acme/rhel:11 has a BaseImage; acme already had 2, the limit")
	}
	push("acme/rhel", "9", d2)
	if bi, _ := get("acme", "acme/rhel", "9"); bi.Spec.Digest != d2 {
		t.Errorf("acme/rhel:9 at the limit names %q, want the pushed %s", bi.Spec.Digest, d2)
	}
	push("globex/debian", "12", d1)
	if _, ok := get("globex", "globex/debian", "12"); !ok {
		t.Errorf("globex/debian:12 has no BaseImage: acme's limit held back another tenant")
	}

	gone, _ := get("acme", "acme/rhel", "10")
	if err := cluster.Client.Delete(t.Context(), gone); err != nil {
		t.Fatal(err)
	}
	push("acme/rhel", "11", d1)
	if _, ok := get("acme", "acme/rhel", "11"); ok {
		t.Errorf("acme/rhel:11 has a BaseImage at once; a tenant at the bound is counted again only after a second")
	}
	clock = clock.Add(2 * time.Second)
	push("acme/rhel", "11", d1)
	if _, ok := get("acme", "acme/rhel", "11"); !ok {
		t.Errorf("acme/rhel:11 has no BaseImage a second after one of acme's went")
	}
}
