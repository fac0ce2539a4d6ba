package hub

import (
	"context"
	"errors"
	"slices"
	"sync"

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
	expected map[string][]verdict.Referrer // Expect's referrers, by subject
}

// maxExpected bounds the subjects Expect remembers referrers for; past it,
// those remembered are dropped, and the registry's listing finds them.
const maxExpected = 1024

// maxExpectedManifest bounds the referrer manifests Expect keeps, in
// bytes: a gate's verdict takes about one KiB; the digest alone is kept
// of a larger one, which is then fetched again.
const maxExpectedManifest = 4 << 10

// NewGateVerdicts finds verdicts in reg signed with trust.
func NewGateVerdicts(reg verdict.Registry, trust verdict.Checker) *GateVerdicts {
	return &GateVerdicts{registry: reg, trust: trust}
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
		also := slices.Clone(g.expected[key])
		g.mu.Unlock()
		v, err := verdict.Find(ctx, g.registry, g.trust, subject, also...)
		if err == nil || errors.Is(err, verdict.ErrNoVerdict) {
			g.mu.Lock()
			if slices.EqualFunc(g.expected[key], also, func(a, b verdict.Referrer) bool { return a.Digest == b.Digest }) {
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
// is read by the next look-ups of subject's verdict until one answers,
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
		g.expected = map[string][]verdict.Referrer{}
	}
	if !slices.ContainsFunc(g.expected[key], func(e verdict.Referrer) bool { return e.Digest == r.Digest }) {
		// Anyone with push access can attach manifests: the newest that
		// verdict.Find reads are kept.
		g.expected[key] = append(g.expected[key], r)[max(0, len(g.expected[key])+1-verdict.MaxAlso):]
	}
}
