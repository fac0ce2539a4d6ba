package hub

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/manager"

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

// PollLoop polls the registry on the leader and queues what changed. Every
// Interval it runs a fast pass, and a full one (every tag's digest looked
// up again) once Resync has passed since the last full pass that
// succeeded; the first pass is a full one. A fast pass may wait while the
// queue still holds events, or Backlog says the reconciler is still
// working through BaseImages (intake.PassSkipper): a first sync of
// thousands of tags is not listed again while it is being applied. A
// failed poll is logged and changes nothing.
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

func (l *PollLoop) backlog() int {
	if l.Backlog == nil {
		return 0
	}
	return l.Backlog()
}

// NewPollLoop returns the loop polling with poller into queue. metrics
// may be nil; logger nil discards.
func NewPollLoop(poller *intake.Poller, queue *intake.Queue, metrics *Metrics, interval, resync time.Duration, logger *slog.Logger) *PollLoop {
	return &PollLoop{poller: poller, queue: queue, metrics: metrics, interval: interval, resync: resync, logger: orDiscard(logger)}
}

// Start polls until ctx ends.
func (l *PollLoop) Start(ctx context.Context) error {
	var lastFull time.Time
	var skipper intake.PassSkipper
	t := time.NewTicker(l.interval)
	defer t.Stop()
	for {
		full := lastFull.IsZero() || time.Since(lastFull) >= l.resync
		if skipper.ShouldSkip(full, l.queue.Len()+l.backlog()) {
			l.metrics.PollSkipped()
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
			}
			continue
		}
		start := time.Now()
		poll := l.poller.Poll
		if full {
			poll = l.poller.PollDigests
		}
		events, err := poll(ctx)
		if full && err == nil {
			lastFull = start
		}
		l.metrics.Polled(full, err)
		if err != nil && ctx.Err() == nil {
			l.logger.Warn("polling the registry failed; nothing is changed until it answers", "error", err)
		}
		if len(events) > 0 {
			l.metrics.Received("poll", len(events))
			l.queue.Add(events)
		}
		l.logger.Debug("poll done", "full", full, "events", len(events), "duration", time.Since(start))
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// NeedLeaderElection reports true: only the leader polls.
func (*PollLoop) NeedLeaderElection() bool { return true }

// WebhookServer serves the registry webhook on every replica, so that a
// registry may notify any of them behind one Service.
type WebhookServer struct {
	addr            string
	handler         http.Handler
	shutdownTimeout time.Duration
	logger          *slog.Logger
}

// NewWebhookServer serves handler on addr; on shutdown, requests in flight
// get shutdownTimeout to finish. logger nil discards.
func NewWebhookServer(addr string, handler http.Handler, shutdownTimeout time.Duration, logger *slog.Logger) *WebhookServer {
	return &WebhookServer{addr: addr, handler: handler, shutdownTimeout: shutdownTimeout, logger: orDiscard(logger)}
}

// Start serves until ctx ends, then shuts down gracefully.
func (s *WebhookServer) Start(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.addr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", s.addr, err)
	}
	srv := &http.Server{Handler: s.handler, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute}
	stopped := make(chan error, 1)
	go func() { stopped <- srv.Serve(ln) }()
	s.logger.Info("webhook listening", "address", ln.Addr().String())
	select {
	case err := <-stopped:
		return fmt.Errorf("serving the webhook: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.shutdownTimeout)
	defer cancel()
	return srv.Shutdown(sctx)
}

// NeedLeaderElection reports false: every replica takes webhooks.
func (*WebhookServer) NeedLeaderElection() bool { return false }

func orDiscard(logger *slog.Logger) *slog.Logger {
	if logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return logger
}
