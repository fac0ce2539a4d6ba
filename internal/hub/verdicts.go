package hub

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"golang.org/x/sync/singleflight"

	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/internal/verdict"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// GateVerdicts finds verdicts in the central registry that one of the
// provider's keys (trust) signed for the digest and its repository.
//
// The tags of one digest share its verdict, and a first sync meets many of
// them at once: look-ups of one digest in flight together make one, and a
// final verdict is remembered for a minute (verdict.Memory).
type GateVerdicts struct {
	registry verdict.Registry
	trust    verdict.Checker
	flight   singleflight.Group
	memory   verdict.Memory

	mu       sync.Mutex
	expected map[string]expectation // Expect's referrers, by subject
	now      func() time.Time
}

// expectation is the referrers a registry announced for a subject, and
// when it last announced one.
type expectation struct {
	referrers []verdict.Referrer
	at        time.Time
}

// maxExpected bounds the subjects Expect remembers referrers for; past it,
// those remembered are dropped, and the registry's listing finds them.
const maxExpected = 1024

// maxExpectedManifest bounds the referrer manifests Expect keeps, in
// bytes: a gate's verdict takes about one KiB; the digest alone is kept
// of a larger one, which is then fetched again.
const maxExpectedManifest = 4 << 10

// expectHold is how long an announced referrer is read besides the
// registry's listing. An answer alone does not end it: distribution
// announces the push of a referrers tag before the tag moves, and a look
// that the announcement starts would not find a verdict the one before
// it found, so a BaseImage's status would flap between the verdict and
// none.
const expectHold = time.Minute

// NewGateVerdicts finds verdicts in reg signed with trust.
func NewGateVerdicts(reg verdict.Registry, trust verdict.Checker) *GateVerdicts {
	return &GateVerdicts{registry: reg, trust: trust, now: time.Now}
}

// Verdict implements Verdicts. The verdict returned is shared: callers
// must not change it.
func (g *GateVerdicts) Verdict(ctx context.Context, subject name.Digest) (*api.Verdict, error) {
	key := subject.String()
	if v, ok := g.memory.Get(key); ok {
		return v, nil
	}
	res, err, _ := g.flight.Do(key, func() (any, error) {
		g.mu.Lock()
		also := slices.Clone(g.expected[key].referrers)
		g.mu.Unlock()
		v, err := verdict.Find(ctx, g.registry, g.trust, subject, also...)
		if err == nil || errors.Is(err, verdict.ErrNoVerdict) {
			g.mu.Lock()
			if e := g.expected[key]; g.now().Sub(e.at) > expectHold {
				delete(g.expected, key)
			}
			g.mu.Unlock()
		}
		if err == nil {
			g.memory.Put(key, v)
		}
		return v, err
	})
	if err != nil {
		return nil, err
	}
	return res.(*api.Verdict), nil
}

// Forget implements Verdicts: the next look-up of subject asks the
// registry, even while another is in flight.
func (g *GateVerdicts) Forget(subject name.Digest) {
	key := subject.String()
	g.flight.Forget(key)
	g.memory.Forget(key)
}

// Expect implements Verdicts: referrer, the manifest a registry event
// says was just pushed with subject as its subject, as read by its digest,
// is read by the next look-ups of subject's verdict for expectHold,
// whether or not the registry lists it yet (distribution moves the
// referrers tag only after it announces the push), without being fetched
// again. It passes the same checks as any listed verdict.
func (g *GateVerdicts) Expect(subject name.Digest, referrer *registry.RawManifest) {
	key := subject.String()
	r := verdict.Referrer{Digest: referrer.Digest}
	if len(referrer.Bytes) <= maxExpectedManifest {
		r.Manifest = referrer
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.expected == nil || len(g.expected) >= maxExpected {
		g.expected = map[string]expectation{}
	}
	e := g.expected[key]
	if !slices.ContainsFunc(e.referrers, func(x verdict.Referrer) bool { return x.Digest == r.Digest }) {
		// Anyone with push access can attach manifests: the newest that
		// verdict.Find reads are kept.
		e.referrers = append(e.referrers, r)[max(0, len(e.referrers)+1-verdict.MaxAlso):]
	}
	e.at = g.now()
	g.expected[key] = e
}
