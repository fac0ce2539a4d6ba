package gate

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestFairQueueTakesTenantsInTurn: a tenant with a thousand images waiting
// delays another tenant's one image by at most one hand-out, and never
// has more than perTenant running.
func TestFairQueueTakesTenantsInTurn(t *testing.T) {
	q := newFairQueue(8, 0, 1, nil)
	for i := range 1000 {
		q.add("flood", work{repo: "flood/img", tag: fmt.Sprint(i)})
	}
	q.add("quiet", work{repo: "quiet/img", tag: "v1"})
	w1, done1, _ := q.next()
	w2, done2, _ := q.next()
	if w1.repo != "flood/img" || w2.repo != "quiet/img" {
		t.Fatalf("handed out %s then %s; want the quiet tenant second", w1.key(), w2.key())
	}
	// flood is at its limit: nothing of it is handed out until done1.
	got := make(chan work, 1)
	go func() { w, _, _ := q.next(); got <- w }()
	select {
	case w := <-got:
		t.Fatalf("handed out %s while the flooding tenant was at its limit", w.key())
	default:
	}
	done2(nil)
	done1(nil)
	if w := <-got; w.repo != "flood/img" {
		t.Errorf("next: %s", w.key())
	}
}

// TestFairQueueKeepsNewestWork: work for an image in progress is not
// lost; it runs once the current run ends, with the newest digest.
func TestFairQueueKeepsNewestWork(t *testing.T) {
	q := newFairQueue(8, 0, 2, nil)
	q.add("acme", work{repo: "acme/rhel", tag: "10", digest: "sha256:1"})
	w, done, _ := q.next()
	q.add("acme", work{repo: "acme/rhel", tag: "10", digest: "sha256:2"})
	q.add("acme", work{repo: "acme/rhel", tag: "10", digest: "sha256:3"})
	if q.len() != 1 {
		t.Fatalf("%d waiting; want the newest one", q.len())
	}
	done(errors.New("registry down"))
	w, _, _ = q.next()
	if w.digest != "sha256:3" {
		t.Errorf("after the run: %+v; want the newest digest", w)
	}
}

// TestARecheckKeepsTheLooksItStandsFor: a recheck that an index of the
// referrers tag brought, replacing pending rechecks of its subject,
// carries that index only when each of them came from it too: the
// poller's Recheck, or another index, still gets its look.
func TestARecheckKeepsTheLooksItStandsFor(t *testing.T) {
	for _, tc := range []struct {
		older, newer, want string
	}{
		{"sha256:a", "sha256:a", "sha256:a"},
		{"", "sha256:a", ""},
		{"sha256:a", "", ""},
		{"sha256:b", "sha256:a", ""},
	} {
		q := newFairQueue(8, 0, 2, nil)
		q.add("acme", work{repo: "acme/rhel", recheck: "sha256:1", index: tc.older})
		q.add("acme", work{repo: "acme/rhel", recheck: "sha256:1", index: tc.newer})
		if w, _, _ := q.next(); q.len() != 0 || w.index != tc.want {
			t.Errorf("index %q replaced by %q: %q, %d more waiting; want %q alone", tc.older, tc.newer, w.index, q.len(), tc.want)
		}
	}
}

// TestANewTenantDoesNotWaitForLongVerifications: with every worker taken
// by two tenants' long verifications, a third tenant's image starts at
// once, in a reserve slot; a fourth waits once the reserve is taken too,
// and so does more work of a tenant already running. A worker slot that
// frees goes to the next tenant in turn; the reserve slot that frees, to
// the fourth.
func TestANewTenantDoesNotWaitForLongVerifications(t *testing.T) {
	q := newFairQueue(4, 1, 2, nil)
	for _, tenant := range []string{"big1", "big2"} {
		for i := range 3 {
			q.add(tenant, work{repo: tenant + "/huge", tag: fmt.Sprint(i)})
		}
	}
	var dones []func(error)
	for range 4 {
		w, done, _ := q.next()
		if w.repo == "" {
			t.Fatal("no work")
		}
		dones = append(dones, done)
	}
	q.add("small", work{repo: "small/img", tag: "v1"})
	q.add("later", work{repo: "later/img", tag: "v1"})
	w, smallDone, _ := q.next()
	if w.repo != "small/img" || !w.reserved {
		t.Fatalf("with the workers busy, handed out %s (reserved %v); want the small tenant's image in a reserve slot", w.key(), w.reserved)
	}
	got := make(chan work, 1)
	go func() { w, _, _ := q.next(); got <- w }()
	select {
	case w := <-got:
		t.Fatalf("handed out %s with workers and reserve taken", w.key())
	default:
	}
	dones[0](nil)
	if w := <-got; w.repo != "big1/huge" || w.reserved {
		t.Errorf("once a worker is free: %s (reserved %v); want the next in turn in a worker slot", w.key(), w.reserved)
	}
	go func() { w, _, _ := q.next(); got <- w }()
	smallDone(nil)
	if w := <-got; w.repo != "later/img" || !w.reserved {
		t.Errorf("once the reserve slot is free: %s (reserved %v); want the tenant with nothing running", w.key(), w.reserved)
	}
}

// TestAHeldTenantWaitsAndTheOthersDoNot: a tenant over its budget gets
// nothing until its hold ends; the others go on meanwhile.
func TestAHeldTenantWaitsAndTheOthersDoNot(t *testing.T) {
	var mu sync.Mutex
	holds := map[string]time.Duration{"spender": time.Hour}
	q := newFairQueue(4, 0, 2, func(tenant string) time.Duration {
		mu.Lock()
		defer mu.Unlock()
		return holds[tenant]
	})
	q.add("spender", work{repo: "spender/a", tag: "1"})
	q.add("thrifty", work{repo: "thrifty/a", tag: "1"})
	if w, _, _ := q.next(); w.repo != "thrifty/a" {
		t.Fatalf("handed out %s; want the tenant under budget", w.key())
	}
	got := make(chan work, 1)
	go func() { w, _, _ := q.next(); got <- w }()
	select {
	case w := <-got:
		t.Fatalf("handed out %s of a held tenant", w.key())
	default:
	}
	mu.Lock()
	holds["spender"] = 10 * time.Millisecond // its spending leaves the window
	mu.Unlock()
	q.add("thrifty", work{repo: "thrifty/b", tag: "1"}) // wakes the waiter to look again
	if w := <-got; w.repo != "thrifty/b" {
		t.Fatalf("handed out %s; want thrifty/b", w.key())
	}
	mu.Lock()
	holds["spender"] = 0
	mu.Unlock()
	if w, _, _ := q.next(); w.repo != "spender/a" {
		t.Errorf("after the hold: %s", w.key())
	}
}

// TestLedgerHoldsATenantUntilItsSpendingLeavesTheWindow: under budget, no
// wait; over it, the wait is until enough of the oldest spending is out of
// the window; other tenants are not held.
func TestLedgerHoldsATenantUntilItsSpendingLeavesTheWindow(t *testing.T) {
	now := time.Unix(1000, 0)
	l := &ledger{budget: Budget{Window: time.Hour, Cost: Cost{CPU: 10 * time.Minute, Decompressed: 1 << 40}}, now: func() time.Time { return now }}
	l.charge("acme", Cost{CPU: 4 * time.Minute})
	now = now.Add(10 * time.Minute)
	l.charge("acme", Cost{CPU: 4 * time.Minute})
	if d := l.wait("acme"); d != 0 {
		t.Errorf("8 of 10 CPU-minutes spent: wait %s, want none", d)
	}
	now = now.Add(10 * time.Minute)
	l.charge("acme", Cost{CPU: 3 * time.Minute, Decompressed: 1})
	if d := l.wait("acme"); d != 40*time.Minute {
		t.Errorf("11 of 10 CPU-minutes spent: wait %s, want 40m (the first spending leaves the window)", d)
	}
	if d := l.wait("globex"); d != 0 {
		t.Errorf("another tenant waits %s", d)
	}
	now = now.Add(40 * time.Minute)
	if d := l.wait("acme"); d != 0 {
		t.Errorf("after the window: wait %s", d)
	}
	l.charge("globex", Cost{Decompressed: 2 << 40})
	if d := l.wait("globex"); d != time.Hour {
		t.Errorf("over the decompressed bound: wait %s, want an hour", d)
	}
}

// TestLargeWorkTakesNoReserveSlot: with the workers taken, a new tenant's
// cheap work takes a reserve slot (and is told so), another's work marked
// large does not, even with a reserve slot free: it waits for a worker.
// Work whose reserve verification stopped with ErrLarge comes back at
// once, marked large, without counting as a failure.
func TestLargeWorkTakesNoReserveSlot(t *testing.T) {
	q := newFairQueue(2, 2, 2, nil)
	q.add("busy", work{repo: "busy/a", tag: "1"})
	q.add("busy", work{repo: "busy/b", tag: "1"})
	var dones []func(error)
	for range 2 {
		w, done, _ := q.next()
		if w.reserved {
			t.Fatalf("%s took a reserve slot with workers free", w.key())
		}
		dones = append(dones, done)
	}
	q.add("large", work{repo: "large/img", tag: "1", large: true})
	q.add("cheap", work{repo: "cheap/img", tag: "1"})
	w, cheapDone, _ := q.next()
	if w.repo != "cheap/img" || !w.reserved {
		t.Fatalf("with the workers busy: %s (reserved %v); want cheap/img in a reserve slot", w.key(), w.reserved)
	}
	got := make(chan work, 1)
	go func() { w, _, _ := q.next(); got <- w }()
	select {
	case w := <-got:
		t.Fatalf("handed out %s (reserved %v) with only a reserve slot free", w.key(), w.reserved)
	case <-time.After(50 * time.Millisecond):
	}
	dones[0](nil)
	if w := <-got; w.repo != "large/img" || w.reserved {
		t.Errorf("once a worker is free: %s (reserved %v); want large/img in a worker slot", w.key(), w.reserved)
	}

	// The cheap work's verification found it large after all.
	cheapDone(fmt.Errorf("the layer declares 8 GiB: %w", ErrLarge))
	k := work{repo: "cheap/img", tag: "1"}.key()
	q.mu.Lock()
	back, large, failures, timer := q.items[k], q.items[k].large, q.failures[k], q.timers[k]
	q.mu.Unlock()
	if back.repo == "" || !large || failures != 0 || timer != nil {
		t.Fatalf("after ErrLarge: back %v, large %v, failures %d, backoff %v; want back at once, large, no failure", back.repo != "", large, failures, timer != nil)
	}
	go func() { w, _, _ := q.next(); got <- w }()
	select {
	case w := <-got:
		t.Fatalf("handed out %s (reserved %v), marked large, with only reserve slots free", w.key(), w.reserved)
	case <-time.After(50 * time.Millisecond):
	}
	dones[1](nil)
	if w := <-got; w.repo != "cheap/img" || w.reserved || !w.large {
		t.Errorf("once a worker is free: %+v; want cheap/img, large, in a worker slot", w)
	}
}
