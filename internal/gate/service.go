package gate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/imagepipe/imagepipe/internal/attest"
	"github.com/imagepipe/imagepipe/internal/intake"
	"github.com/imagepipe/imagepipe/internal/verdict"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// Defaults of a Service.
const (
	DefaultWorkers   = 4
	DefaultPerTenant = 1
	// retryMin and retryMax bound the wait before a digest whose
	// verification failed (not a rejection: the registry, a lease) is
	// tried again.
	retryMin = time.Second
	retryMax = 5 * time.Minute
)

// ServiceRegistry is what the service needs of the registry.
type ServiceRegistry interface {
	Registry
	verdict.Registry
	Resolve(ctx context.Context, ref name.Tag) (digest string, found bool, err error)
}

// Leases keep replicas from verifying one digest at once. Acquire takes
// the lease of key; ok is false while another holder has it. The lease is
// held (renewed) until release is called, or lost if the holder dies.
type Leases interface {
	Acquire(ctx context.Context, key string) (release func(), ok bool, err error)
}

// Service gives each digest pushed under a tag one signed verdict: events
// in, verdicts attached to the digests out. Work is shared fairly between
// tenants: at most PerTenant verifications of one tenant run at once, and
// tenants with work take turns for the Workers. One digest is never
// verified twice at once (in this process; across replicas, with Leases),
// and a digest that already has a verdict signed by a trusted key is not
// verified again, so a restart redoes nothing that finished.
type Service struct {
	Verifier *Verifier
	Registry ServiceRegistry
	// RegistryName is the central registry events are about.
	RegistryName name.Registry
	Signer       *attest.Signer
	// Trust recognises verdicts already given: the provider's key ring,
	// which holds the signer's key.
	Trust verdict.Checker
	// Leases coordinate replicas; nil means this is the only one.
	Leases Leases
	// Workers and PerTenant bound verifications at once, in all and per
	// tenant; 0 means DefaultWorkers and DefaultPerTenant.
	Workers, PerTenant int
	Metrics            *Metrics
	Logger             *slog.Logger

	once  sync.Once
	queue *fairQueue
}

func (s *Service) init() {
	s.once.Do(func() {
		per := s.PerTenant
		if per <= 0 {
			per = DefaultPerTenant
		}
		s.queue = newFairQueue(per)
		if s.Logger == nil {
			s.Logger = slog.New(slog.DiscardHandler)
		}
	})
}

// Add takes events from the webhook or the poller: pushes under a tag are
// queued; deletes and pushes by digest alone (the gate's own canonical
// images and verdicts among them) are not images to verify.
func (s *Service) Add(events []intake.Event) {
	s.init()
	for _, e := range events {
		if e.Action != intake.ActionPush || e.Tag == "" || api.IsAttachmentTag(e.Tag) {
			continue
		}
		tenant, _, _ := strings.Cut(e.Repository, "/")
		s.queue.add(tenant, work{repo: e.Repository, tag: e.Tag, digest: e.Digest})
	}
	s.Metrics.queued(s.queue.len())
}

// Run verifies queued work until ctx ends.
func (s *Service) Run(ctx context.Context) error {
	s.init()
	n := s.Workers
	if n <= 0 {
		n = DefaultWorkers
	}
	stop := context.AfterFunc(ctx, s.queue.shutdown)
	defer stop()
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for {
				w, done, ok := s.queue.next()
				if !ok {
					return
				}
				err := s.handleSafely(ctx, w)
				if err != nil && ctx.Err() == nil {
					s.Logger.Warn("no verdict yet; retrying with backoff", "repository", w.repo, "tag", w.tag, "digest", w.digest, "error", err)
				}
				done(err)
				s.Metrics.queued(s.queue.len())
			}
		})
	}
	wg.Wait()
	return nil
}

// handleSafely is handleWork with a panic turned into an error: a bug that
// one image triggers stops neither the other verifications nor the
// process, and the image is tried again after a backoff.
func (s *Service) handleSafely(ctx context.Context, w work) (err error) {
	defer func() {
		if p := recover(); p != nil {
			s.Metrics.failed()
			s.Logger.Error("verification panicked; it is retried with backoff", "repository", w.repo, "tag", w.tag, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			err = fmt.Errorf("verification panicked: %v", p)
		}
	}()
	return s.handleWork(ctx, w)
}

// handleWork resolves a tag that came without a digest and gives the
// digest its verdict.
func (s *Service) handleWork(ctx context.Context, w work) error {
	repo, err := name.NewRepository(s.RegistryName.RegistryStr() + "/" + w.repo)
	if err != nil {
		return err
	}
	d := w.digest
	if d == "" {
		var found bool
		d, found, err = s.Registry.Resolve(ctx, repo.Tag(w.tag))
		if err != nil || !found {
			return err // a tag that is gone needs no verdict
		}
	}
	_, err = s.Handle(ctx, repo.Digest(d))
	return err
}

// ErrBusy is Handle's error while another replica holds the digest's
// lease: it is tried again later, by which time the verdict may be there.
var ErrBusy = errors.New("another replica is verifying the digest")

// Handle gives subject its verdict: the one already attached and signed
// by a trusted key, or a new one, verified, signed and attached.
func (s *Service) Handle(ctx context.Context, subject name.Digest) (*api.Verdict, error) {
	s.init()
	if v, err := verdict.Find(ctx, s.Registry, s.Trust, subject); err == nil {
		return v, nil
	} else if !errors.Is(err, verdict.ErrNoVerdict) {
		return nil, err
	}
	if s.Leases != nil {
		release, ok, err := s.Leases.Acquire(ctx, subject.String())
		if err != nil {
			return nil, fmt.Errorf("taking the lease of %s: %w", subject, err)
		}
		if !ok {
			return nil, ErrBusy
		}
		defer release()
		// Another replica may have finished between the look-up and the lease.
		if v, err := verdict.Find(ctx, s.Registry, s.Trust, subject); err == nil {
			return v, nil
		}
	}
	start := time.Now()
	v, err := s.Verifier.Verify(ctx, subject)
	if err != nil {
		s.Metrics.failed()
		return nil, err
	}
	raw, err := s.Registry.FetchManifest(ctx, subject)
	if err != nil {
		return nil, err
	}
	desc := ocispec.Descriptor{MediaType: string(raw.MediaType), Digest: digest.Digest(raw.Digest), Size: int64(len(raw.Bytes))}
	ref, err := verdict.Publish(ctx, s.Registry, s.Signer, subject, desc, v)
	if err != nil {
		return nil, fmt.Errorf("publishing the verdict on %s: %w", subject, err)
	}
	s.Metrics.verdict(v, time.Since(start))
	s.Logger.Info("verdict given", "subject", subject.String(), "verdict", v.Verdict, "reasons", v.Reasons, "referrer", ref, "seconds", time.Since(start).Seconds())
	return v, nil
}
