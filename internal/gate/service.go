package gate

import (
	"context"
	"encoding/json"
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
	"github.com/imagepipe/imagepipe/internal/imageref"
	"github.com/imagepipe/imagepipe/internal/intake"
	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/internal/reject"
	"github.com/imagepipe/imagepipe/internal/verdict"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// Defaults of a Service.
const (
	DefaultWorkers = 4
	// DefaultPerTenant is half the default workers: one tenant's burst
	// takes two, and two stay free for the others.
	DefaultPerTenant = 2
	// retryMin and retryMax bound the wait before a digest whose
	// verification failed (not a rejection: the registry, a lease) is
	// tried again.
	retryMin = time.Second
	retryMax = 5 * time.Minute
	// DefaultReserveMaxBytes is what an image verified in a reserve slot
	// may declare (ReserveMaxBytes): 1 GiB.
	DefaultReserveMaxBytes = 1 << 30
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
	// Verifier verifies in this process, and names the engine in verdicts.
	Verifier *Verifier
	// Isolated, when set, runs each verification in a child process
	// instead, so that one that crashes or runs out of memory stops no
	// other.
	Isolated *Child
	Registry ServiceRegistry
	// RegistryName is the central registry events are about.
	RegistryName name.Registry
	Signer       *attest.Signer
	// Trust recognises verdicts already given: the provider's key ring,
	// which holds the signer's key.
	Trust verdict.Checker
	// TenantKeys is the tenants' signature policy; nil means no tenant
	// requires signatures.
	TenantKeys *TenantKeys
	// Leases coordinate replicas; nil means this is the only one.
	Leases Leases
	// Store keeps the verdicts given, to publish again one that a tenant
	// hid or deleted in the registry; nil keeps none. Verifier.Store keeps
	// the layers' outcomes.
	Store *Store
	// Workers and PerTenant bound verifications at once, in all and per
	// tenant; 0 means DefaultWorkers and DefaultPerTenant. Reserve more
	// may run for tenants that have none running; 0 means half of
	// Workers, rounded up.
	Workers, PerTenant, Reserve int
	// ReserveMaxBytes makes the reserve a lane for cheap work: a
	// verification in a reserve slot stops at once (ErrLarge) on an image
	// whose layer, disk/disk.img or qcow2 virtual size is declared over
	// it, and runs again in a worker slot only. A tenant with none
	// running thus waits at most for the reserve verifications ahead of
	// it, each of an image declaring at most this. 0 means
	// DefaultReserveMaxBytes.
	ReserveMaxBytes int64
	// Budget bounds what one tenant's verifications spend in a window
	// (see Budget); the zero value means DefaultBudget.
	Budget  Budget
	Metrics *Metrics
	Logger  *slog.Logger

	once     sync.Once
	queue    *fairQueue
	spent    *ledger
	awaiting awaitingSet
	// given are the subjects this gate gave verdicts (those in Store when
	// it started, and since), looked at again after each full poll.
	verdictsGiven awaitingSet
	overLimit     limitCounts
	// memory holds final verdicts given or found lately, so that the
	// other tags of a digest cost no look-up; attachments, which may have
	// dropped a verdict, are always looked up.
	memory verdict.Memory
	own    ownWrites
	// handling serialises the handlings of one subject in this process.
	handling subjectLocks
	heldMu   sync.Mutex
	held     map[string]bool // tenants waiting for their budget, logged
}

// holdOverBudget is how long tenant's work waits for its budget (the
// queue's hold), logged once each time the tenant starts waiting.
func (s *Service) holdOverBudget(tenant string) time.Duration {
	d := s.spent.wait(tenant)
	s.heldMu.Lock()
	defer s.heldMu.Unlock()
	switch {
	case d > 0 && !s.held[tenant]:
		if s.held == nil {
			s.held = map[string]bool{}
		}
		s.held[tenant] = true
		s.Logger.Info("tenant over its budget; its next verification waits", "tenant", tenant, "wait", d.Round(time.Second))
	case d == 0 && s.held[tenant]:
		delete(s.held, tenant)
	}
	return d
}

func (s *Service) init() {
	s.once.Do(func() {
		per := s.PerTenant
		if per <= 0 {
			per = DefaultPerTenant
		}
		budget := s.Budget
		if budget == (Budget{}) {
			budget = DefaultBudget
		}
		s.spent = &ledger{budget: budget, now: time.Now}
		for _, subject := range s.Store.VerdictSubjects() {
			if d, err := name.NewDigest(subject, registry.NameOptions(s.RegistryName)...); err == nil {
				s.verdictsGiven.add(d)
			}
		}
		if s.Logger == nil {
			s.Logger = slog.New(slog.DiscardHandler)
		}
		s.queue = newFairQueue(s.workers(), s.reserve(), per, s.holdOverBudget)
	})
}

// Add takes events from the webhook or the poller. Pushes under a tag are
// queued for a verdict; deletes are not images to verify. A push of an
// attachment (a referrers tag, a manifest pushed by digest alone) may be a
// tenant's signature, or a write that dropped the gate's verdict from a
// referrers tag that another writer was extending at once: the digest it
// is about is looked at again when its verdict awaits a signature or is
// gone; a referrers tag pushed at an index this gate read back listing
// the verdict it gave, which stands, is not looked at.
func (s *Service) Add(events []intake.Event) {
	s.init()
	for _, e := range events {
		if e.Action != intake.ActionPush {
			continue
		}
		tenant, err := imageref.Tenant(e.Repository)
		if err != nil {
			// No hub serves it, and its cost would be charged to no
			// tenant: it gets no verdict, so nothing imports it.
			s.Logger.Debug("no verdict for a repository outside the tenant rule", "repository", e.Repository, "error", err)
			continue
		}
		switch {
		case e.Tag != "" && !api.IsAttachmentTag(e.Tag):
			s.queue.add(tenant, work{repo: e.Repository, tag: e.Tag, digest: e.Digest})
		case e.Tag != "":
			w := work{repo: e.Repository, recheck: "sha256:" + e.Tag[len("sha256-"):len("sha256-")+64], index: e.Digest}
			s.queue.add(tenant, w)
			// distribution announces a tag push before the tag points at
			// the new manifest: the digest is looked at again a little later.
			for _, after := range recheckAgain {
				time.AfterFunc(after, func() { s.queue.add(tenant, w) })
			}
		case e.Digest != "" && !s.own.has(e.Repository+"@"+e.Digest):
			s.queue.add(tenant, work{repo: e.Repository, referrer: e.Digest})
		}
	}
	s.Metrics.queued(s.queue.len())
}

func (s *Service) workers() int {
	if s.Workers > 0 {
		return s.Workers
	}
	return DefaultWorkers
}

// MaxRunning is how many verifications may run at once: Workers, and
// Reserve more for tenants with none running.
func (s *Service) MaxRunning() int { return s.workers() + s.reserve() }

func (s *Service) reserveMaxBytes() int64 {
	if s.ReserveMaxBytes > 0 {
		return s.ReserveMaxBytes
	}
	return DefaultReserveMaxBytes
}

func (s *Service) reserve() int {
	if s.Reserve > 0 {
		return s.Reserve
	}
	return (s.workers() + 1) / 2
}

// recheckAgain are when a digest whose referrers tag was pushed is looked
// at again after the first look.
var recheckAgain = []time.Duration{time.Second, 5 * time.Second}

// Polled takes one pass of the poller (daemon.PollLoop): its events are
// queued as a webhook's are, and after a full pass, failed or not, every
// subject awaiting a signature or given a verdict is looked at again
// (Recheck).
func (s *Service) Polled(full bool, events []intake.Event, _ error) {
	s.Add(events)
	if full {
		s.Recheck()
	}
}

// AllTenants lets the poller list every tenant's repositories: the gate
// verifies what any tenant pushes. A tenant is what imageref.Tenant says.
type AllTenants struct{}

// Namespace returns the tenant of repository, and no namespace: the gate
// has none.
func (AllTenants) Namespace(repository string) (string, string, error) {
	tenant, err := imageref.Tenant(repository)
	return tenant, "", err
}

// Queued is how many events wait for a worker.
func (s *Service) Queued() int {
	s.init()
	return s.queue.len()
}

// Recheck queues every subject refused for want of a signature, and
// every subject this gate gave a verdict, to be looked at again: the
// poller's way to learn of signatures on registries that announce them by
// webhook only, and of verdicts a tenant deleted without an event (on a
// registry with the referrers API, a deleted referrer): they are
// published again.
func (s *Service) Recheck() {
	s.init()
	for _, d := range append(s.awaiting.list(), s.verdictsGiven.list()...) {
		if tenant, err := imageref.Tenant(d.RepositoryStr()); err == nil {
			s.queue.add(tenant, work{repo: d.RepositoryStr(), recheck: d.DigestStr()})
		}
	}
	s.Metrics.queued(s.queue.len())
}

// Run verifies queued work until ctx ends.
func (s *Service) Run(ctx context.Context) error {
	s.init()
	n := s.workers() + s.reserve()
	stop := context.AfterFunc(ctx, s.queue.shutdown)
	defer stop()
	if s.Isolated != nil {
		go s.Isolated.refill() // the first verification's child starts now
		defer s.Isolated.Close()
	}
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for {
				w, done, ok := s.queue.next()
				if !ok {
					return
				}
				err := s.handleSafely(s.laneContext(ctx, w), w)
				if errors.Is(err, ErrLarge) {
					s.Logger.Info("the image declares more than a reserve slot takes; it waits for a worker", "repository", w.repo, "tag", w.tag, "digest", w.digest, "error", err)
				} else if err != nil && ctx.Err() == nil {
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

// laneContext is ctx for the verification of w: in a reserve slot, it
// stops on an image that declares more than ReserveMaxBytes.
func (s *Service) laneContext(ctx context.Context, w work) context.Context {
	if !w.reserved {
		return ctx
	}
	return WithMaxDeclared(ctx, s.reserveMaxBytes())
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

// handleWork gives the digest w is about its verdict: a tag's (resolved
// when the event named no digest), or, for a possible signature, the
// subject's when its verdict awaits one.
func (s *Service) handleWork(ctx context.Context, w work) error {
	repo, err := name.NewRepository(s.RegistryName.RegistryStr()+"/"+w.repo, registry.NameOptions(s.RegistryName)...)
	if err != nil {
		return err
	}
	s.Logger.Debug("handling", "repository", w.repo, "tag", w.tag, "digest", w.digest, "recheck", w.recheck, "referrer", w.referrer)
	switch {
	case w.referrer != "":
		subject, ok, err := s.subjectOf(ctx, repo.Digest(w.referrer))
		if err != nil || !ok {
			return err
		}
		return s.recheck(ctx, repo.Digest(subject), w.referrer, "")
	case w.recheck != "":
		return s.recheck(ctx, repo.Digest(w.recheck), "", w.index)
	}
	d := w.digest
	if d == "" {
		var found bool
		d, found, err = s.Registry.Resolve(ctx, repo.Tag(w.tag))
		if err != nil || !found {
			return err // a tag that is gone needs no verdict
		}
	}
	subject := repo.Digest(d)
	if _, ok := s.memory.Get(subject.String()); ok {
		return nil // another tag of the digest, verified a moment ago
	}
	_, err = s.Handle(ctx, subject)
	return err
}

// recheck handles subject again when it has no verdict, or one that
// awaits a signature; referrer, when set, is a manifest just pushed with
// subject as its subject, checked as a signature even if the referrers
// listing lost it, and index, when set, the digest subject's referrers
// tag was pushed at. It is handle: one look for the verdict, under the
// subject's lock, decides.
func (s *Service) recheck(ctx context.Context, subject name.Digest, referrer, index string) error {
	_, err := s.handle(ctx, subject, referrer, index)
	return err
}

// subjectOf reads the manifest pushed as referrer and returns the digest
// it is attached to; ok is false for a manifest attached to nothing, and
// for the gate's own verdicts and SBOMs.
func (s *Service) subjectOf(ctx context.Context, referrer name.Digest) (string, bool, error) {
	raw, err := s.Registry.FetchManifest(ctx, referrer)
	if err != nil {
		return "", false, err
	}
	var m struct {
		Subject     *struct{ Digest string } `json:"subject"`
		Annotations map[string]string        `json:"annotations"`
	}
	err = json.Unmarshal(raw.Bytes, &m)
	if p := m.Annotations[verdict.PredicateTypeAnnotation]; err != nil || m.Subject == nil || p == api.VerdictPredicateType || p == attest.CycloneDXPredicateType {
		return "", false, nil
	}
	if _, err := digest.Parse(m.Subject.Digest); err != nil || !strings.HasPrefix(m.Subject.Digest, "sha256:") {
		return "", false, nil
	}
	return m.Subject.Digest, true, nil
}

// ErrBusy is Handle's error while another replica holds the digest's
// lease: it is tried again later, by which time the verdict may be there.
var ErrBusy = errors.New("another replica is verifying the digest")

// Handle gives subject its verdict: the one already attached and signed
// by a trusted key, or a new one, verified, signed and attached. A
// verdict that refused the subject only for want of its tenant's
// signature is looked at again: when the signature check now answers
// otherwise, the subject gets a new verdict (the newest counts).
func (s *Service) Handle(ctx context.Context, subject name.Digest) (*api.Verdict, error) {
	return s.handle(ctx, subject, "", "")
}

// handle is Handle, with referrer (when set) checked as a signature on
// subject besides those the registry lists. index, when set, is the
// digest subject's referrers tag was pushed at: when this gate read that
// index back listing the verdict it gave, which stands, there is nothing
// to look at, and handle returns no verdict and no error.
func (s *Service) handle(ctx context.Context, subject name.Digest, referrer, index string) (*api.Verdict, error) {
	s.init()
	if err := s.handling.lock(ctx, subject.String()); err != nil {
		return nil, err
	}
	defer s.handling.unlock(subject.String())
	if index != "" && s.own.has(subject.RepositoryStr()+"@"+index) {
		return nil, nil
	}
	prev, done, err := s.given(ctx, subject)
	if done {
		s.awaiting.remove(subject) // a verdict that stands awaits nothing
	}
	if err != nil || done {
		return prev, err
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
		if prev, done, err = s.given(ctx, subject); done {
			s.awaiting.remove(subject)
		}
		if err != nil || done {
			return prev, err
		}
	}
	start := time.Now()
	// The subject's manifest, which the verdict names and the
	// verification reads, is fetched once, while the signature check runs.
	type fetched struct {
		raw *registry.RawManifest
		err error
	}
	manifest := make(chan fetched, 1)
	go func() {
		raw, err := s.Registry.FetchManifest(ctx, subject)
		manifest <- fetched{raw, err}
	}()
	if again, msg := s.republishable(subject, prev); again != nil {
		m := <-manifest
		if m.err != nil {
			return nil, m.err
		}
		return s.publish(ctx, subject, m.raw, again, start, msg)
	}
	keyID, refusal, err := s.signatureCheck(ctx, subject, referrer)
	if err != nil {
		s.Metrics.failed()
		return nil, err
	}
	var v *api.Verdict
	var m fetched
	switch {
	case refusal != nil && prev != nil && sameRefusal(prev, refusal):
		s.awaiting.add(subject)
		return prev, nil // nothing new: no second verdict saying the same
	case refusal != nil:
		v = s.Verifier.refusal(subject, *refusal)
	default:
		if m = <-manifest; m.err != nil {
			s.Metrics.failed()
			return nil, m.err
		}
		v, err = s.verify(ctx, subject, m.raw)
		switch {
		case errors.Is(err, ErrCPULimit):
			v, err = s.Verifier.refusal(subject, api.Rejection{Code: string(reject.VerificationLimit), Message: err.Error()}), nil
		case errors.Is(err, ErrOverLimit) && s.overLimit.count(subject) >= MaxOverLimit:
			v, err = s.Verifier.refusal(subject, api.Rejection{Code: string(reject.VerificationLimit),
				Message: fmt.Sprintf("%d verifications in a row went past the memory or time limit: %v", MaxOverLimit, err)}), nil
		case errors.Is(err, ErrCrashed) && s.overLimit.count(subject) >= MaxOverLimit:
			v, err = s.Verifier.refusal(subject, api.Rejection{Code: string(reject.VerificationLimit),
				Message: fmt.Sprintf("%d verifications in a row crashed on the image: %v", MaxOverLimit, err)}), nil
		case errors.Is(err, ErrLarge):
			return nil, err // not a failure: it runs again in a worker slot
		}
		if err != nil {
			s.Metrics.failed()
			return nil, err
		}
		s.overLimit.forget(subject)
		v.SignedBy = keyID
	}
	if m.raw == nil {
		if m = <-manifest; m.err != nil {
			return nil, m.err
		}
	}
	if err := s.Store.PutVerdict(subject, v); err != nil {
		s.Logger.Warn("the verdict is not kept; hidden, it would be computed again", "subject", subject.String(), "error", err)
	}
	return s.publish(ctx, subject, m.raw, v, start, "verdict given")
}

// republishable is a final verdict subject already had, to be signed and
// attached again rather than computed again, with what the log says of
// it: prev, which a trusted key other than the current one signed, or the
// one the Store kept, hidden or deleted since in the registry. nil means
// none.
func (s *Service) republishable(subject name.Digest, prev *api.Verdict) (*api.Verdict, string) {
	if prev != nil && !verdict.AwaitsSignature(prev) {
		return prev, "verdict signed again with the current key"
	}
	if kept, ok := s.Store.Verdict(subject); ok && !verdict.AwaitsSignature(kept) {
		return kept, "verdict published again"
	}
	return nil, ""
}

// publish signs v and attaches it to subject, whose manifest is raw, with
// the SBOMs of its images (publishSBOMs), and remembers it; msg is what
// the log says of it.
func (s *Service) publish(ctx context.Context, subject name.Digest, raw *registry.RawManifest, v *api.Verdict, start time.Time, msg string) (*api.Verdict, error) {
	if err := s.publishSBOMs(ctx, subject, raw, v); err != nil {
		return nil, err
	}
	desc := ocispec.Descriptor{MediaType: string(raw.MediaType), Digest: digest.Digest(raw.Digest), Size: int64(len(raw.Bytes))}
	att, err := verdict.Publish(ctx, s.Registry, s.Signer, subject, desc, v)
	if err != nil {
		return nil, fmt.Errorf("publishing the verdict on %s: %w", subject, err)
	}
	repoName := subject.Context().RepositoryStr()
	if verdict.AwaitsSignature(v) {
		s.awaiting.add(subject)
	} else {
		s.awaiting.remove(subject)
		if att.ReferrersTag != "" {
			// The push of the referrers tag at this index announces a
			// listing read back with the verdict in it: a look would find
			// that verdict, which stands.
			s.own.add(repoName + "@" + att.ReferrersTag)
		}
	}
	s.memory.Put(subject.String(), v)
	s.verdictsGiven.add(subject)
	ref := att.Digest
	s.own.add(repoName + "@" + ref)
	for _, im := range v.Images {
		s.own.add(repoName + "@" + im.Canonical)
	}
	s.Metrics.verdict(v, time.Since(start))
	s.Logger.Info(msg, "subject", subject.String(), "verdict", v.Verdict, "reasons", v.Reasons, "signedBy", v.SignedBy, "referrer", ref, "seconds", time.Since(start).Seconds())
	return v, nil
}

// verify reads subject, whose manifest is raw, in full, in a child
// process when Isolated is set, and charges what it spent to its tenant.
// Under a limit on what the image declares (WithMaxDeclared), a layer
// that the manifest of an image declares over it is ErrLarge before any
// child starts.
func (s *Service) verify(ctx context.Context, subject name.Digest, raw *registry.RawManifest) (*api.Verdict, error) {
	tenant, err := imageref.Tenant(subject.RepositoryStr())
	if err != nil {
		return nil, err
	}
	var m ocispec.Manifest
	if maxDeclared(ctx) > 0 && json.Unmarshal(raw.Bytes, &m) == nil {
		for _, l := range m.Layers {
			if err := checkDeclared(ctx, "the layer descriptor", l.Size); err != nil {
				return nil, err
			}
		}
	}
	if s.Isolated == nil {
		return s.Verifier.VerifyManifest(ctx, subject, raw)
	}
	v, cost, err := s.Isolated.Verify(ctx, subject, raw)
	s.Logger.Info("verification spent", "subject", subject.String(), "cpuSeconds", cost.CPU.Seconds(), "peakMemory", cost.PeakMemory, "decompressed", cost.Decompressed, "spooled", cost.Spooled)
	s.spent.charge(tenant, cost)
	s.Metrics.spent(tenant, cost)
	return v, err
}

// given finds the verdict subject already has. done is true when it
// stands and the current signing key signed it; a verdict that awaits the
// tenant's signature, or that an older trusted key signed (a key being
// rotated out), is returned with done false, to be looked at again (and
// signed again).
func (s *Service) given(ctx context.Context, subject name.Digest) (v *api.Verdict, done bool, err error) {
	v, key, err := verdict.FindSigned(ctx, s.Registry, s.Trust, subject)
	switch {
	case errors.Is(err, verdict.ErrNoVerdict):
		return nil, false, nil
	case err != nil:
		return nil, false, err
	}
	if key != s.Signer.KeyID() {
		return v, false, nil
	}
	s.memory.Put(subject.String(), v)
	return v, !verdict.AwaitsSignature(v), nil
}

// sameRefusal reports whether v already refused its subject for the
// reason r gives.
func sameRefusal(v *api.Verdict, r *api.Rejection) bool {
	return len(v.Reasons) == 1 && v.Reasons[0] == *r
}
