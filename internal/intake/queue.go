package intake

import (
	"context"
	"sync"
	"time"

	"k8s.io/client-go/util/workqueue"
)

// ImageKey identifies the image an event is about: a repository and a tag,
// or a digest for registries that announce deletes by digest only.
type ImageKey struct {
	Repository string
	Ref        string // tag, or "sha256:..." when the event named no tag
}

func keyOf(e Event) ImageKey {
	if e.Tag != "" {
		return ImageKey{e.Repository, e.Tag}
	}
	return ImageKey{e.Repository, e.Digest}
}

// Queue coalesces events from webhooks and polling per image: a burst of
// pushes to one tag is handled once, with the newest event. An image is
// handed to one worker at a time; an event that arrives while its image is
// being handled waits, and is handed out once the work in hand is done,
// even when it equals the event in hand (Quay's pushes name no digest, so
// two pushes to a tag look alike). Failed work is retried with exponential
// backoff (from 1 s to 5 min) until it succeeds or newer news arrives. It
// is safe for concurrent use.
type Queue struct {
	mu sync.Mutex
	// latest holds each image's newest event not yet handed out, and the
	// event of failed work until its retry is handed out.
	latest map[ImageKey]Event
	queue  workqueue.TypedRateLimitingInterface[ImageKey]
}

// NewQueue returns an empty queue.
func NewQueue() *Queue {
	limiter := workqueue.NewTypedItemExponentialFailureRateLimiter[ImageKey](time.Second, 5*time.Minute)
	return &Queue{
		latest: map[ImageKey]Event{},
		queue:  workqueue.NewTypedRateLimitingQueue(limiter),
	}
}

// Add records events; for each image only the newest is kept.
func (in *Queue) Add(events []Event) {
	in.mu.Lock()
	defer in.mu.Unlock()
	for _, e := range events {
		k := keyOf(e)
		in.latest[k] = e
		in.queue.Add(k)
	}
}

// Next blocks until an image needs work and returns its newest event and a
// done function to call exactly once with the outcome: nil forgets the
// image, an error retries it later unless a newer event for the image came
// in meanwhile, which is handed out instead, without waiting for the
// backoff. ok is false once Shutdown was called or ctx ended;
// ctx is the workers' lifetime, and its end shuts the whole queue down.
func (in *Queue) Next(ctx context.Context) (e Event, done func(error), ok bool) {
	stop := context.AfterFunc(ctx, in.queue.ShutDown)
	defer stop()
	for {
		k, shutdown := in.queue.Get()
		if shutdown {
			return Event{}, nil, false
		}
		in.mu.Lock()
		e, pending := in.latest[k]
		delete(in.latest, k)
		in.mu.Unlock()
		if !pending { // a retry whose image newer news already handled
			in.queue.Done(k)
			continue
		}
		return e, func(err error) {
			defer in.queue.Done(k)
			in.mu.Lock()
			defer in.mu.Unlock()
			if err == nil {
				in.queue.Forget(k)
				return
			}
			if _, newer := in.latest[k]; !newer {
				in.latest[k] = e
				in.queue.AddRateLimited(k)
			}
		}, true
	}
}

// Len is the number of images waiting, for the queue-depth metric.
func (in *Queue) Len() int { return in.queue.Len() }

// Shutdown stops handing out work; Next returns ok false.
func (in *Queue) Shutdown() { in.queue.ShutDown() }
