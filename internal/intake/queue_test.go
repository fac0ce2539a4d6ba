package intake

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
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

// An event that arrives while its image is being handled is handed out
// once that work is done. Quay's pushes name no digest, so a second push
// to a tag equals the first one in hand and must not be taken for it.
func TestQueueHandlesEventsArrivingDuringWork(t *testing.T) {
	quayPush := Event{Action: ActionPush, Repository: "acme/rhel", Tag: "9", Source: "quay"}
	for _, tc := range []struct {
		name          string
		inHand, newer Event
	}{
		{"a push to the tag again, without a digest", quayPush, quayPush},
		{"a push of a new digest", Event{Action: ActionPush, Repository: "acme/rhel", Tag: "9", Digest: dig1}, Event{Action: ActionPush, Repository: "acme/rhel", Tag: "9", Digest: dig2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := NewQueue()
			in.Add([]Event{tc.inHand})
			e, done, ok := in.Next(t.Context())
			if !ok || e != tc.inHand {
				t.Fatalf("first Next: %+v, %v", e, ok)
			}
			in.Add([]Event{tc.newer})
			done(nil)
			// Bounded only so that a lost event fails instead of hanging.
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			again, done2, ok := in.Next(ctx)
			if !ok {
				t.Fatal("the event that arrived during the work was never handed out")
			}
			if again != tc.newer {
				t.Fatalf("handed out %+v after the work, want %+v", again, tc.newer)
			}
			done2(nil)
			if in.Len() != 0 {
				t.Errorf("%d queued after both were handled", in.Len())
			}
		})
	}
}

// Failed work whose image gets newer news, while the work is in hand or
// during its backoff, is not retried: the newer event is handed out
// instead, and once it has been handled nothing more is handed out for the
// image, neither the old event nor an empty one.
func TestQueueRetryGivesWayToNewerEvent(t *testing.T) {
	old := Event{Action: ActionPush, Repository: "acme/rhel", Tag: "9", Digest: dig1}
	newer := Event{Action: ActionPush, Repository: "acme/rhel", Tag: "9", Digest: dig2}
	other := Event{Action: ActionPush, Repository: "acme/fedora", Tag: "42", Digest: dig1}
	for _, tc := range []struct {
		name          string
		duringBackoff bool
	}{
		{"while the work is in hand", false},
		{"during the backoff", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := NewQueue()
			in.Add([]Event{old})
			_, done, _ := in.Next(t.Context())
			if !tc.duringBackoff {
				in.Add([]Event{newer})
			}
			done(errors.New("apiserver unavailable"))
			if tc.duringBackoff {
				in.Add([]Event{newer})
			}
			e, done, ok := in.Next(t.Context())
			if !ok || e != newer {
				t.Fatalf("after the failure: %+v, %v; want the newer event", e, ok)
			}
			done(nil)
			// other fails after any retry of acme/rhel:9 was scheduled,
			// so its own retry, after the same first backoff, comes later.
			in.Add([]Event{other})
			_, done, _ = in.Next(t.Context())
			done(errors.New("apiserver unavailable"))
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			e, done, ok = in.Next(ctx)
			if !ok || e != other {
				t.Fatalf("handed out %+v, %v; want only the retry of %+v", e, ok, other)
			}
			done(nil)
		})
	}
}
