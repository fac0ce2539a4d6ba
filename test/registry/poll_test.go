package registry

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/imagepipe/imagepipe/internal/cdi"
	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// TestPollingAgainstTheRegistry: polling the real registry reports new and
// moved tags of the served tenants once, a deleted tag only after it is
// confirmed gone, and nothing at all while the registry is down.
func TestPollingAgainstTheRegistry(t *testing.T) {
	testenv.RequireQEMU(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{})
	disk1 := makeDisk(t, t.TempDir(), 8, 1, "qcow2")
	disk2 := makeDisk(t, t.TempDir(), 12, 1, "qcow2")
	cache := t.TempDir()
	a1 := importOK(t, cache, disk1, reg.Host+"/acme/a:1")
	a2 := importOK(t, cache, disk2, reg.Host+"/acme/a:2")
	importOK(t, cache, disk1, reg.Host+"/other/b:1")

	client, err := registry.New(registry.WithCacheDir(""))
	if err != nil {
		t.Fatal(err)
	}
	tenancy, err := cdi.NewTenancy("", []string{"acme"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	host, _ := name.NewRegistry(reg.Host)
	p := cdi.NewPoller(host, client, tenancy)
	poll := func() []cdi.Event {
		t.Helper()
		ev, err := p.Poll(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		slices.SortFunc(ev, func(a, b cdi.Event) int { return strings.Compare(a.Tag, b.Tag) })
		return ev
	}

	want := []cdi.Event{
		{Action: cdi.ActionPush, Repository: "acme/a", Tag: "1", Digest: a1.Digest, Source: "poll"},
		{Action: cdi.ActionPush, Repository: "acme/a", Tag: "2", Digest: a2.Digest, Source: "poll"},
	}
	if got := poll(); !slices.Equal(got, want) {
		t.Fatalf("first poll: %+v, want %+v (tenant other is not served)", got, want)
	}
	if got := poll(); len(got) != 0 {
		t.Errorf("a poll with no change: %+v", got)
	}

	moved := importOK(t, cache, disk2, reg.Host+"/acme/a:1")
	if got := poll(); len(got) != 1 || got[0].Tag != "1" || got[0].Digest != moved.Digest || got[0].Action != cdi.ActionPush {
		t.Errorf("after moving tag 1: %+v", got)
	}

	// The registry goes away: polls fail and report nothing, least of all deletes.
	reg.Kill(t)
	if ev, err := p.Poll(t.Context()); err == nil || len(ev) != 0 {
		t.Errorf("poll of a dead registry: %+v, %v", ev, err)
	}
	reg.Restart(t)
	if got := poll(); len(got) != 0 {
		t.Errorf("poll after the restart: %+v", got)
	}

	// Tag 2 and tag 1 now share a digest; delete by digest removes both.
	r := testenv.RunCommand(t, testenv.Command{Name: testenv.Imagectl, Args: []string{"delete", "--force", reg.Host + "/acme/a:2"}})
	if r.Code != 0 {
		t.Fatalf("delete: exit %d: %s", r.Code, r.Stderr)
	}
	got := poll()
	if len(got) != 2 || got[0].Action != cdi.ActionDelete || got[1].Action != cdi.ActionDelete {
		t.Errorf("after the delete: %+v, want deletes of tags 1 and 2", got)
	}
}
