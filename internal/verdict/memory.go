package verdict

import (
	"sync"
	"time"

	"github.com/imagepipe/imagepipe/pkg/api"
)

// Bounds of a Memory.
const (
	memoryTTL     = time.Minute
	memoryEntries = 10000
)

// Memory remembers final verdicts (any but one awaiting the tenant's
// signature, which the gate replaces once the signature comes) by subject
// for a minute, so that the many tags of one digest cost one look-up.
// Nothing else is remembered: a digest without a verdict is looked up
// again each time. It is safe for concurrent use; the zero value is ready.
type Memory struct {
	mu    sync.Mutex
	known map[string]remembered
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

type remembered struct {
	v       *api.Verdict
	expires time.Time
}

// Get returns the verdict remembered for subject ("REPO@sha256:…"), if
// any. It is shared: callers must not change it.
func (m *Memory) Get(subject string) (*api.Verdict, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.known[subject]
	if !ok || m.now().After(r.expires) {
		return nil, false
	}
	return r.v, true
}

// Put remembers v for subject when it is final.
func (m *Memory) Put(subject string, v *api.Verdict) {
	if v == nil || AwaitsSignature(v) {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	if m.known == nil {
		m.known = map[string]remembered{}
	}
	if len(m.known) >= memoryEntries {
		for k, r := range m.known {
			if now.After(r.expires) {
				delete(m.known, k)
			}
		}
		if len(m.known) >= memoryEntries {
			clear(m.known)
		}
	}
	m.known[subject] = remembered{v: v, expires: now.Add(memoryTTL)}
}

// Forget drops what is remembered for subject.
func (m *Memory) Forget(subject string) {
	m.mu.Lock()
	delete(m.known, subject)
	m.mu.Unlock()
}

func (m *Memory) now() time.Time {
	if m.Now != nil {
		return m.Now()
	}
	return time.Now()
}
