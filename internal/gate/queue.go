package gate

import (
	"errors"
	"sync"
	"time"
)

// work is one tag to give a verdict (with its digest when the event named
// one), or a digest whose verdict may await a signature: recheck names it,
// or referrer names a manifest that may be a signature attached to it.
type work struct {
	repo, tag, digest string
	recheck, referrer string
	// index, for a recheck brought by a push of the subject's referrers
	// tag, is the digest the tag was pushed at.
	index string
	// large is work whose image declares more than the reserve takes
	// (ErrLarge): it runs in a worker slot only.
	large bool
	// reserved is set by next on work it hands out in a reserve slot: its
	// verification stops with ErrLarge on an image that declares more
	// than the reserve takes.
	reserved bool
}

// replacing is w replacing older pending work of the same key: the index
// that brought w stands for both only when it brought the older work too.
func (w work) replacing(older work) work {
	if older.index != w.index {
		w.index = ""
	}
	return w
}

// key identifies what a piece of work is about; newer work for the same
// key replaces older work that has not started.
func (w work) key() string {
	switch {
	case w.recheck != "":
		return w.repo + "@" + w.recheck
	case w.referrer != "":
		return w.repo + "@" + w.referrer + "~referrer"
	}
	return w.repo + ":" + w.tag
}

// fairQueue hands out work tenant by tenant in turn, at most perTenant of
// one tenant at once and at most workers in worker slots, so that a tenant
// pushing a thousand images delays another's by at most one verification
// per worker. With every worker slot taken, up to reserve more go to
// tenants that have nothing running, in reserve slots: a tenant's first
// image does not wait for others' long verifications to end (the kernel
// then shares the cores, see niceAfter). The reserve is a lane for cheap
// work: a verification in a reserve slot stops at once on an image that
// declares more than the lane takes (ErrLarge), and its work comes back
// marked large, which only a worker slot takes; so a tenant with nothing
// running waits at most for the reserve verifications ahead of it, each
// bounded by what it may declare, however many long ones others run.
// A tenant whose hold is not zero (over its budget) waits that long. Work
// for an image that is in progress waits until it is done, then runs with
// the newest event; failed work comes back after a backoff.
type fairQueue struct {
	mu        sync.Mutex
	cond      *sync.Cond
	perTenant int
	workers   int
	reserve   int
	hold      func(tenant string) time.Duration
	wakeUp    *time.Timer // ends the wait for the first hold to end, at wakeAt
	wakeAt    time.Time
	runs      int                    // work in progress in worker slots
	reserved  int                    // work in progress in reserve slots
	tenants   []string               // tenants with pending work, in turn order
	pending   map[string][]string    // tenant → keys in arrival order
	items     map[string]work        // key → newest work not yet started
	running   map[string]work        // work in progress, by key
	active    map[string]int         // tenant → work in progress
	failures  map[string]int         // key → consecutive failures
	timers    map[string]*time.Timer // key → pending retry
	closed    bool
}

// newFairQueue hands out work as fairQueue says; hold nil holds no one.
func newFairQueue(workers, reserve, perTenant int, hold func(string) time.Duration) *fairQueue {
	if hold == nil {
		hold = func(string) time.Duration { return 0 }
	}
	q := &fairQueue{
		workers: workers, reserve: reserve, hold: hold,
		perTenant: perTenant, pending: map[string][]string{}, items: map[string]work{},
		running: map[string]work{}, active: map[string]int{}, failures: map[string]int{},
		timers: map[string]*time.Timer{},
	}
	q.cond = sync.NewCond(&q.mu)
	return q
}

// add queues w for tenant, replacing older pending work of its image.
func (q *fairQueue) add(tenant string, w work) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.addLocked(tenant, w)
}

func (q *fairQueue) addLocked(tenant string, w work) {
	if q.closed {
		return
	}
	k := w.key()
	older, waiting := q.items[k]
	if waiting {
		w = w.replacing(older)
	}
	q.items[k] = w
	_, running := q.running[k]
	if waiting || running {
		return // queued already, or re-queued when the run ends
	}
	if t := q.timers[k]; t != nil {
		t.Stop()
		delete(q.timers, k)
	}
	q.enqueue(tenant, k)
}

func (q *fairQueue) enqueue(tenant, k string) {
	if len(q.pending[tenant]) == 0 {
		q.tenants = append(q.tenants, tenant)
	}
	q.pending[tenant] = append(q.pending[tenant], k)
	q.cond.Signal()
}

// next blocks until a tenant under its limit has work, and returns the
// work (reserved when it takes a reserve slot) and the function to call
// with its outcome. ok is false once the queue is shut down.
func (q *fairQueue) next() (w work, done func(error), ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for {
		if q.closed {
			return work{}, nil, false
		}
		var held time.Duration
		for i, tenant := range q.tenants {
			if q.active[tenant] >= q.perTenant {
				continue
			}
			keys := q.pending[tenant]
			k := keys[0]
			inReserve := q.runs >= q.workers
			if inReserve && (q.active[tenant] > 0 || q.reserved >= q.reserve || q.items[k].large) {
				continue
			}
			if d := q.hold(tenant); d > 0 {
				if held == 0 || d < held {
					held = d
				}
				continue
			}
			q.pending[tenant] = keys[1:]
			// The tenant goes to the back of the turn order.
			q.tenants = append(q.tenants[:i:i], q.tenants[i+1:]...)
			if len(q.pending[tenant]) > 0 {
				q.tenants = append(q.tenants, tenant)
			} else {
				delete(q.pending, tenant)
			}
			w := q.items[k]
			delete(q.items, k)
			q.running[k] = w
			q.active[tenant]++
			if w.reserved = inReserve; inReserve {
				q.reserved++
			} else {
				q.runs++
			}
			return w, func(err error) { q.finish(tenant, k, w.reserved, err) }, true
		}
		if at := time.Now().Add(held); held > 0 && (q.wakeUp == nil || at.Before(q.wakeAt)) {
			if q.wakeUp != nil {
				q.wakeUp.Stop()
			}
			q.wakeAt = at
			q.wakeUp = time.AfterFunc(held, func() {
				q.mu.Lock()
				defer q.mu.Unlock()
				q.wakeUp = nil
				q.cond.Broadcast()
			})
		}
		q.cond.Wait()
	}
}

// finish ends a run, in a reserve slot or not: newer work of the image
// runs next; work that stopped with ErrLarge comes back at once, marked
// large, not counted as a failure; failed work comes back after its
// backoff.
func (q *fairQueue) finish(tenant, k string, reserved bool, err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	failed := q.running[k]
	delete(q.running, k)
	if reserved {
		q.reserved--
	} else {
		q.runs--
	}
	q.active[tenant]--
	if q.active[tenant] == 0 {
		delete(q.active, tenant)
	}
	q.cond.Broadcast()
	if _, newer := q.items[k]; newer {
		q.failures[k] = 0
		q.enqueue(tenant, k)
		return
	}
	if err == nil {
		delete(q.failures, k)
		return
	}
	if errors.Is(err, ErrLarge) {
		failed.large, failed.reserved = true, false
		q.addLocked(tenant, failed)
		return
	}
	q.failures[k]++
	delay := min(retryMin<<min(q.failures[k]-1, 10), retryMax)
	q.timers[k] = time.AfterFunc(delay, func() {
		q.mu.Lock()
		defer q.mu.Unlock()
		delete(q.timers, k)
		if _, newer := q.items[k]; !newer {
			q.addLocked(tenant, failed)
		}
	})
}

// len is the number of images waiting.
func (q *fairQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items)
}

// shutdown stops handing out work.
func (q *fairQueue) shutdown() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	for _, t := range q.timers {
		t.Stop()
	}
	if q.wakeUp != nil {
		q.wakeUp.Stop()
	}
	q.cond.Broadcast()
}
