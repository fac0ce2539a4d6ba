package intake

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

func TestQueueCoalescesBursts(t *testing.T) {
	in := NewQueue()
	for i := range 100 {
		digest := fmt.Sprintf("sha256:%064x", i)
		in.Add([]Event{{Action: ActionPush, Repository: "acme/rhel", Tag: "10", Digest: digest}})
	}
	in.Add([]Event{{Action: ActionPush, Repository: "acme/rhel", Tag: "9", Digest: dig1}})
	if in.Len() != 2 {
		t.Fatalf("%d images queued after a burst, want 2", in.Len())
	}
	seen := map[string]string{}
	for range 2 {
		e, done, ok := in.Next(t.Context())
		if !ok {
			t.Fatal("queue shut down")
		}
		seen[e.Tag] = e.Digest
		done(nil)
	}
	if seen["10"] != fmt.Sprintf("sha256:%064x", 99) || seen["9"] != dig1 {
		t.Errorf("handled %v, want the newest digest of each tag", seen)
	}
}

func TestQueueRetriesFailures(t *testing.T) {
	in := NewQueue()
	in.Add([]Event{{Action: ActionDelete, Repository: "acme/rhel", Digest: dig2}})
	e, done, _ := in.Next(t.Context())
	if e.Digest != dig2 {
		t.Fatalf("got %+v", e)
	}
	done(errors.New("apiserver unavailable"))
	again, done2, ok := in.Next(t.Context()) // comes back after the backoff
	if !ok || again != e {
		t.Fatalf("retry: %+v, %v", again, ok)
	}
	done2(nil)
	if in.Len() != 0 {
		t.Errorf("%d queued after success", in.Len())
	}
}

func TestQueueStopsWithContext(t *testing.T) {
	in := NewQueue()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, _, ok := in.Next(ctx); ok {
		t.Error("Next returned work after its context ended")
	}
}
