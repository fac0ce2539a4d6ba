package registry

import (
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/imagepipe/imagepipe/internal/hub"
	"github.com/imagepipe/imagepipe/internal/intake"
	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// TestPollingAgainstTheRegistry: polling the real registry reports new tags
// of the served tenants once, moved tags on a full pass, a deleted tag only
// after it is confirmed gone, and nothing at all while the registry is
// down; a fast pass with nothing changed costs one request per catalog
// page and one per served repository.
func TestPollingAgainstTheRegistry(t *testing.T) {
	testenv.RequireQEMU(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{})
	disk1 := makeDisk(t, t.TempDir(), 8, 1, "qcow2")
	disk2 := makeDisk(t, t.TempDir(), 12, 1, "qcow2")
	cache := t.TempDir()
	a1 := importOK(t, cache, disk1, reg.Host+"/acme/a:1")
	a2 := importOK(t, cache, disk2, reg.Host+"/acme/a:2")
	importOK(t, cache, disk1, reg.Host+"/other/b:1")
	c1 := importOK(t, cache, disk2, reg.Host+"/acme/c:1")

	var mu sync.Mutex
	var requests []string // "METHOD path"
	observe := func(method, path string, status int) {
		mu.Lock()
		requests = append(requests, method+" "+path)
		mu.Unlock()
	}
	client, err := registry.New(registry.WithCacheDir(""), registry.WithRequestObserver(observe))
	if err != nil {
		t.Fatal(err)
	}
	tenancy, err := hub.NewTenancy("", []string{"acme"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	host, _ := name.NewRegistry(reg.Host)
	p := intake.NewPoller(host, client, tenancy)
	pass := func(full bool) []intake.Event {
		t.Helper()
		do := p.Poll
		if full {
			do = p.PollDigests
		}
		ev, err := do(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		slices.SortFunc(ev, func(a, b intake.Event) int {
			return strings.Compare(a.Repository+":"+a.Tag, b.Repository+":"+b.Tag)
		})
		return ev
	}
	poll := func() []intake.Event { t.Helper(); return pass(false) }

	want := []intake.Event{
		{Action: intake.ActionPush, Repository: "acme/a", Tag: "1", Digest: a1.Digest, Source: "poll"},
		{Action: intake.ActionPush, Repository: "acme/a", Tag: "2", Digest: a2.Digest, Source: "poll"},
		{Action: intake.ActionPush, Repository: "acme/c", Tag: "1", Digest: c1.Digest, Source: "poll"},
	}
	if got := poll(); !slices.Equal(got, want) {
		t.Fatalf("first poll: %+v, want %+v (tenant other is not served)", got, want)
	}
	mu.Lock()
	requests = nil
	mu.Unlock()
	if got := poll(); len(got) != 0 {
		t.Errorf("a poll with no change: %+v", got)
	}
	mu.Lock()
	pages, listings := 0, 0
	for _, r := range requests {
		switch {
		case r == "GET /v2/_catalog":
			pages++
		case strings.HasPrefix(r, "GET /v2/acme/") && strings.HasSuffix(r, "/tags/list"):
			listings++
		}
	}
	if served := 2; pages < 1 || listings != served || len(requests) != pages+served {
		t.Errorf("a poll with no change sent %d requests, want %d catalog pages + %d served repositories: %q", len(requests), pages, served, requests)
	}
	mu.Unlock()

	// Tag 1 moves to another digest; distribution lists the same tags, so
	// only a full pass, which looks every tag up, sees it.
	moved := importOK(t, cache, disk2, reg.Host+"/acme/a:1")
	if got := poll(); len(got) != 0 {
		t.Errorf("a fast pass after moving tag 1: %+v, want nothing", got)
	}
	if got := pass(true); len(got) != 1 || got[0].Tag != "1" || got[0].Digest != moved.Digest || got[0].Action != intake.ActionPush {
		t.Errorf("a full pass after moving tag 1: %+v", got)
	}

	// The registry goes away: polls fail and report nothing, least of all deletes.
	reg.Kill(t)
	if ev, err := p.Poll(t.Context()); err == nil || len(ev) != 0 {
		t.Errorf("poll of a dead registry: %+v, %v", ev, err)
	}
	if ev, err := p.PollDigests(t.Context()); err == nil || len(ev) != 0 {
		t.Errorf("full poll of a dead registry: %+v, %v", ev, err)
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
	if len(got) != 2 || got[0].Action != intake.ActionDelete || got[1].Action != intake.ActionDelete {
		t.Errorf("after the delete: %+v, want deletes of tags 1 and 2", got)
	}
}
