package gate

import "sync"

// maxOwnWrites bounds the manifests the gate remembers writing.
const maxOwnWrites = 4096

// ownWrites remembers, by "REPO@DIGEST", the manifests the gate wrote
// itself (canonical images, verdicts), whose push events need no look at:
// they are neither tenants' images nor signatures. The oldest are
// forgotten first; one forgotten costs a manifest fetch, nothing more.
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
