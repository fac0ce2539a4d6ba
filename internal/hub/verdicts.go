package hub

import (
	"context"

	"github.com/google/go-containerregistry/pkg/name"
	"golang.org/x/sync/singleflight"

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
}

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
		v, err := verdict.Find(ctx, g.registry, g.trust, subject)
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
