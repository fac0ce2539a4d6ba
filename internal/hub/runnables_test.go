package hub

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/imagepipe/imagepipe/internal/daemon"
	"github.com/imagepipe/imagepipe/internal/intake"
)

// catalogCounter is a registry of one repository with one tag that counts
// its catalog requests: one per poll.
type catalogCounter struct{ catalogs atomic.Int64 }

func (c *catalogCounter) Repositories(context.Context, name.Registry) ([]string, error) {
	c.catalogs.Add(1)
	return []string{"acme/rhel"}, nil
}

func (c *catalogCounter) ListTags(context.Context, name.Repository, string) ([]string, string, bool, error) {
	return []string{"9"}, "", false, nil
}

func (c *catalogCounter) Resolve(context.Context, name.Tag) (string, bool, error) {
	return "sha256:1111111111111111111111111111111111111111111111111111111111111111", true, nil
}

type everyTenant struct{}

func (everyTenant) Namespace(repo string) (string, string, error) { return "acme", "acme", nil }

// A tenant who keeps the queue full must not stop the fast passes that
// catch the other tenants' missed webhooks: they are skipped at most
// maxSkippedPasses in a row.
func TestPollingGoesOnWhileTheQueueNeverDrains(t *testing.T) {
	reg, err := name.NewRegistry("registry.example")
	if err != nil {
		t.Fatal(err)
	}
	counter := &catalogCounter{}
	queue := intake.NewQueue() // no worker takes from it
	queue.Add([]intake.Event{{Action: intake.ActionPush, Repository: "acme/flood", Tag: "1", Digest: "sha256:2222222222222222222222222222222222222222222222222222222222222222", Source: "test"}})
	loop := NewPollLoop(intake.NewPoller(reg, counter, everyTenant{}), queue, nil, time.Millisecond, time.Hour, nil)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- loop.Start(ctx) }()
	deadline := time.After(10 * time.Second)
	for counter.catalogs.Load() < 3 { // the first, full, pass and two fast ones
		select {
		case <-deadline:
			cancel()
			t.Fatalf("%d polls in 10 s, at one every millisecond, while the queue held an event", counter.catalogs.Load())
		case <-time.After(5 * time.Millisecond):
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// While the reconciler still works through BaseImages (a first sync of
// thousands of tags), fast passes wait as they do for queued events:
// listing every repository again would find nothing the sync does not
// already hold.
func TestFastPassesWaitForTheReconcilersBacklog(t *testing.T) {
	reg, err := name.NewRegistry("registry.example")
	if err != nil {
		t.Fatal(err)
	}
	counter := &catalogCounter{}
	loop := NewPollLoop(intake.NewPoller(reg, counter, everyTenant{}), intake.NewQueue(), nil, time.Millisecond, time.Hour, nil)
	var looks atomic.Int64
	loop.Backlog = func() int {
		looks.Add(1)
		return 1000
	}
	const ticks = 5 * (daemon.MaxSkippedPasses + 1)
	// One full pass, then at most one fast pass per MaxSkippedPasses+1 ticks.
	most := int64(1 + ticks/(daemon.MaxSkippedPasses+1) + 1)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- loop.Start(ctx) }()
	deadline := time.After(10 * time.Second)
	for looks.Load() < ticks && counter.catalogs.Load() <= 2*most {
		select {
		case <-deadline:
			cancel()
			t.Fatalf("%d looks at the backlog and %d passes in 10 s, at one tick every millisecond", looks.Load(), counter.catalogs.Load())
		case <-time.After(5 * time.Millisecond):
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if passes := counter.catalogs.Load(); passes > most {
		t.Errorf("%d passes in %d looks at a backlog of 1000 BaseImages; want at most %d", passes, looks.Load(), most)
	}
}
