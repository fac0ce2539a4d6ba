package gate

import (
	"context"
	"sync"
)

// maxOwnWrites bounds the manifests the gate remembers writing.
const maxOwnWrites = 4096

// ownWrites remembers, by "REPO@DIGEST", the manifests the gate wrote
// itself (canonical images, verdicts), whose push events need no look at:
// they are neither tenants' images nor signatures; and the referrers-tag
// indexes it read back listing a verdict it gave that stands, whose
// pushes announce nothing a look would act on. The oldest are forgotten
// first; one forgotten costs a look, nothing more.
type ownWrites struct {
	mu    sync.Mutex
	set   map[string]bool
	order []string
}

func (o *ownWrites) add(key string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.set == nil {
		o.set = map[string]bool{}
	}
	if o.set[key] {
		return
	}
	if len(o.order) >= maxOwnWrites {
		delete(o.set, o.order[0])
		o.order = o.order[1:]
	}
	o.set[key] = true
	o.order = append(o.order, key)
}

func (o *ownWrites) has(key string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.set[key]
}

// subjectLocks lets one handling of a subject run at a time in this
// process, whatever brought it (a tag, an attachment, a recheck): the
// second waits, then finds the first's verdict. Replicas coordinate
// through Leases instead.
type subjectLocks struct {
	mu   sync.Mutex
	held map[string]chan struct{}
}

// lock waits until key is free and takes it; it fails only when ctx ends.
func (l *subjectLocks) lock(ctx context.Context, key string) error {
	for {
		l.mu.Lock()
		if l.held == nil {
			l.held = map[string]chan struct{}{}
		}
		busy, ok := l.held[key]
		if !ok {
			l.held[key] = make(chan struct{})
			l.mu.Unlock()
			return nil
		}
		l.mu.Unlock()
		select {
		case <-busy:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (l *subjectLocks) unlock(key string) {
	l.mu.Lock()
	close(l.held[key])
	delete(l.held, key)
	l.mu.Unlock()
}
