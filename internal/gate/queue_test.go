package gate

import (
	"errors"
	"fmt"
	"testing"
)

// TestFairQueueTakesTenantsInTurn: a tenant with a thousand images waiting
// delays another tenant's one image by at most one hand-out, and never
// has more than perTenant running.
func TestFairQueueTakesTenantsInTurn(t *testing.T) {
	q := newFairQueue(1)
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
	q := newFairQueue(2)
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
