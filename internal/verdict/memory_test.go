package verdict

import (
	"fmt"
	"testing"
	"time"

	"github.com/imagepipe/imagepipe/internal/reject"
	"github.com/imagepipe/imagepipe/pkg/api"
)

func TestMemoryKeepsFinalVerdictsForAMinute(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	m := &Memory{Now: func() time.Time { return now }}
	accepted := &api.Verdict{Verdict: api.VerdictAccepted}
	refused := &api.Verdict{Verdict: api.VerdictRejected, Reasons: []api.Rejection{{Code: string(reject.BackingFile)}}}
	unsigned := &api.Verdict{Verdict: api.VerdictRejected, Reasons: []api.Rejection{{Code: string(reject.Unsigned)}}}

	m.Put("r@a", accepted)
	m.Put("r@b", refused)
	m.Put("r@c", unsigned)
	if v, ok := m.Get("r@a"); !ok || v != accepted {
		t.Errorf("an accepted verdict is not remembered")
	}
	if v, ok := m.Get("r@b"); !ok || v != refused {
		t.Errorf("a final refusal is not remembered")
	}
	if _, ok := m.Get("r@c"); ok {
		t.Errorf("a refusal awaiting the tenant's signature is remembered; the gate replaces it once the signature comes")
	}
	if _, ok := m.Get("other@a"); ok {
		t.Errorf("a verdict is remembered for another repository's digest")
	}

	m.Forget("r@b")
	if _, ok := m.Get("r@b"); ok {
		t.Errorf("a forgotten verdict is still remembered")
	}
	now = now.Add(memoryTTL + time.Second)
	if _, ok := m.Get("r@a"); ok {
		t.Errorf("a verdict is remembered past %s", memoryTTL)
	}
}

func TestMemoryIsBounded(t *testing.T) {
	m := &Memory{}
	v := &api.Verdict{Verdict: api.VerdictAccepted}
	for i := range 3 * memoryEntries {
		m.Put(fmt.Sprintf("r@%d", i), v)
	}
	if n := len(m.known); n > memoryEntries {
		t.Errorf("%d verdicts remembered, over the bound of %d", n, memoryEntries)
	}
	if _, ok := m.Get(fmt.Sprintf("r@%d", 3*memoryEntries-1)); !ok {
		t.Errorf("the newest verdict is not remembered")
	}
}
