package hub

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/imagepipe/imagepipe/internal/daemon"
	"github.com/imagepipe/imagepipe/internal/intake"
)

// The loops of the syncer, as runnables of the controller manager: the
// workers and the webhook server run on every replica, the poller on the
// leader only.
var (
	_ manager.LeaderElectionRunnable = (*Workers)(nil)
	_ manager.LeaderElectionRunnable = (*PollLoop)(nil)
	_ manager.LeaderElectionRunnable = (*WebhookServer)(nil)
	_ manager.Runnable               = (*Workers)(nil)
	_ manager.Runnable               = (*PollLoop)(nil)
	_ manager.Runnable               = (*WebhookServer)(nil)
)

// Workers hand the events of an intake queue to an applier, several at
// once, on every replica: the API server's optimistic concurrency settles
// races between replicas.
type Workers struct {
	queue   *intake.Queue
	applier *Applier
	metrics *Metrics
	n       int
	logger  *slog.Logger
}

// NewWorkers returns n workers (at least one) applying the events of
// queue. metrics may be nil; logger nil discards.
func NewWorkers(queue *intake.Queue, applier *Applier, metrics *Metrics, n int, logger *slog.Logger) *Workers {
	return &Workers{queue: queue, applier: applier, metrics: metrics, n: max(n, 1), logger: orDiscard(logger)}
}

// Start applies events until ctx ends; the end of ctx also shuts the queue
// down. A failed event is logged and retried by the queue with backoff.
func (w *Workers) Start(ctx context.Context) error {
	var wg sync.WaitGroup
	for range w.n {
		wg.Go(func() {
			for {
				e, finish, ok := w.queue.Next(ctx)
				if !ok {
					return
				}
				err := w.applier.Apply(ctx, e)
				w.metrics.Applied(e, err)
				if err != nil && ctx.Err() == nil {
					w.logger.Warn("event not applied; retrying with backoff", "repository", e.Repository, "tag", e.Tag, "source", e.Source, "error", err)
				}
				finish(err)
			}
		})
	}
	wg.Wait()
	return nil
}

// NeedLeaderElection reports false: every replica applies events.
func (*Workers) NeedLeaderElection() bool { return false }

// PollLoop is daemon.PollLoop on the leader, queueing what changed. A
// fast pass waits while the queue still holds events or Backlog says the
// reconciler is still working through BaseImages. Each pass, and each
// fast pass that waits, is counted in the metrics.
type PollLoop struct {
	// Backlog, when set, is the reconciler's work waiting now
	// (Reconciler.Backlog).
	Backlog func() int

	poller           *intake.Poller
	queue            *intake.Queue
	metrics          *Metrics
	interval, resync time.Duration
	logger           *slog.Logger
}

// NewPollLoop returns the loop polling with poller into queue. metrics
// may be nil; logger nil discards.
func NewPollLoop(poller *intake.Poller, queue *intake.Queue, metrics *Metrics, interval, resync time.Duration, logger *slog.Logger) *PollLoop {
	return &PollLoop{poller: poller, queue: queue, metrics: metrics, interval: interval, resync: resync, logger: logger}
}

// Start polls until ctx ends.
func (l *PollLoop) Start(ctx context.Context) error {
	loop := &daemon.PollLoop{
		Poller: l.poller, Interval: l.interval, Resync: l.resync, Logger: l.logger,
		Waiting: func() int {
			n := l.queue.Len()
			if l.Backlog != nil {
				n += l.Backlog()
			}
			return n
		},
		Skipped: l.metrics.PollSkipped,
		Polled: func(full bool, events []intake.Event, err error) {
			l.metrics.Polled(full, err)
			if len(events) > 0 {
				l.metrics.Received("poll", len(events))
				l.queue.Add(events)
			}
		},
	}
	return loop.Run(ctx)
}

// NeedLeaderElection reports true: only the leader polls.
func (*PollLoop) NeedLeaderElection() bool { return true }

// WebhookServer serves the registry webhook (daemon.Server) on every
// replica, so that a registry may notify any of them behind one Service.
type WebhookServer struct{ server daemon.Server }

// NewWebhookServer serves handler on addr; on shutdown, requests in flight
// get shutdownTimeout to finish. logger nil discards.
func NewWebhookServer(addr string, handler http.Handler, shutdownTimeout time.Duration, logger *slog.Logger) *WebhookServer {
	return &WebhookServer{server: daemon.Server{Name: "webhook", Addr: addr, Handler: handler, ShutdownTimeout: shutdownTimeout, Logger: logger}}
}

// Start serves until ctx ends, then shuts down gracefully.
func (s *WebhookServer) Start(ctx context.Context) error { return s.server.Run(ctx) }

// NeedLeaderElection reports false: every replica takes webhooks.
func (*WebhookServer) NeedLeaderElection() bool { return false }

func orDiscard(logger *slog.Logger) *slog.Logger {
	if logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return logger
}
