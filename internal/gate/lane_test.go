package gate

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/imagepipe/imagepipe/internal/intake"
)

// TestTheReserveIsALaneForCheapWork: two tenants' long verifications
// take the workers (two each), two more tenants each send one to the
// reserve; a fifth tenant's small image still gets its verdict at once.
// The long ones sent to the reserve stop there at once (the played child
// exits ExitLarge under a limit, see TestMain) and wait for a worker,
// marked large, not counted as failures.
func TestTheReserveIsALaneForCheapWork(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("PLAY_GATE_CHILD", "lane")
	e := newEnv(t)
	s, _ := e.service(t, newSigner(t))
	s.Isolated = &Child{Path: exe, TempDir: t.TempDir(), StopGrace: time.Second}
	s.Workers, s.Reserve, s.PerTenant = 4, 2, 2
	img := craftImage(t, rawDisk(t, 1<<20, 30))
	push := func(repo string) intake.Event {
		return intake.Event{Action: intake.ActionPush, Repository: repo, Tag: "v1", Digest: img.push(t, e, repo)}
	}
	long := []intake.Event{push("huge1/a"), push("huge1/b"), push("huge2/a"), push("huge2/b")}
	reserveTakers := []intake.Event{push("huge3/a"), push("huge4/a")}
	small := push("small/img")

	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() { s.Run(ctx) })
	defer wg.Wait()
	defer cancel()
	s.init()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("waited 10 s for %s", what)
			}
		}
	}
	running := func() int {
		s.queue.mu.Lock()
		defer s.queue.mu.Unlock()
		return len(s.queue.running)
	}
	s.Add(long)
	waitFor("the long verifications to take the workers", func() bool { return running() == 4 })
	s.Add(reserveTakers)
	// Each has had its turn in the reserve: it runs (the attack) or it
	// is back, marked large.
	tried := func() bool {
		s.queue.mu.Lock()
		defer s.queue.mu.Unlock()
		for _, ev := range reserveTakers {
			k := work{repo: ev.Repository, tag: ev.Tag}.key()
			if _, ok := s.queue.running[k]; !ok && !s.queue.items[k].large {
				return false
			}
		}
		return true
	}
	waitFor("the reserve takers' turn", tried)

	start := time.Now()
	s.Add([]intake.Event{small})
	subject := mustDigest(t, e.host+"/"+small.Repository+"@"+small.Digest)
	for {
		if _, ok := s.memory.Get(subject.String()); ok {
			break
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("with 4 tenants' long verifications in the workers and the reserve, a new tenant's small image waited 10 s with no verdict")
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("the small image's verdict came %s after its push", time.Since(start).Round(time.Millisecond))

	// A reserve taker whose child was still starting comes back too.
	waitFor("the reserve takers back in the queue", func() bool {
		s.queue.mu.Lock()
		defer s.queue.mu.Unlock()
		for _, ev := range reserveTakers {
			if _, ok := s.queue.running[work{repo: ev.Repository, tag: ev.Tag}.key()]; ok {
				return false
			}
		}
		return true
	})
	s.queue.mu.Lock()
	defer s.queue.mu.Unlock()
	for _, ev := range reserveTakers {
		k := work{repo: ev.Repository, tag: ev.Tag}.key()
		w, waiting := s.queue.items[k]
		if !waiting || !w.large || s.queue.failures[k] != 0 || s.queue.timers[k] != nil {
			t.Errorf("%s: waiting %v, large %v, failures %d, backoff %v; want waiting, large, no failure", k, waiting, w.large, s.queue.failures[k], s.queue.timers[k] != nil)
		}
	}
	if n := s.queue.runs; n != 4 {
		t.Errorf("%d in worker slots; want the 4 long verifications", n)
	}
}

// TestALayerDeclaredOverTheLimitStartsNoChild: in a reserve slot, an
// image whose manifest declares a layer over the limit is ErrLarge before
// any child starts (this Child cannot start one).
func TestALayerDeclaredOverTheLimitStartsNoChild(t *testing.T) {
	e := newEnv(t)
	s, _ := e.service(t, newSigner(t))
	s.Isolated = &Child{Path: "/nonexistent/image-gate", TempDir: t.TempDir()}
	s.ReserveMaxBytes = 100 // the layer of a 1 MiB disk is larger, gzipped
	d := craftImage(t, rawDisk(t, 1<<20, 31)).push(t, e, "acme/img")
	s.init()
	w := work{repo: "acme/img", tag: "v1", digest: d, reserved: true}
	if err := s.handleWork(s.laneContext(t.Context(), w), w); !errors.Is(err, ErrLarge) {
		t.Errorf("in a reserve slot: %v; want ErrLarge", err)
	}
	w.reserved = false
	if err := s.handleWork(s.laneContext(t.Context(), w), w); err == nil || errors.Is(err, ErrLarge) {
		t.Errorf("in a worker slot: %v; want the child's failure to start", err)
	}
}

// TestAVerificationUnderALimitStopsOnWhatTheImageDeclares: under a limit
// (WithMaxDeclared), a disk/disk.img whose tar header, or a qcow2 whose
// virtual size, is over it stops the verification with ErrLarge, not a
// verdict; without the limit, each gets its verdict.
func TestAVerificationUnderALimitStopsOnWhatTheImageDeclares(t *testing.T) {
	e := newEnv(t)
	for what, disk := range map[string][]byte{
		"a 4 MiB raw disk":                     rawDisk(t, 4<<20, 32),
		"a qcow2 of 320 KiB declaring 512 MiB": amplifier(),
	} {
		repo := "acme/declared"
		d := craftImage(t, disk).push(t, e, repo)
		subject := mustDigest(t, e.host+"/"+repo+"@"+d)
		raw, err := e.reg.FetchManifest(t.Context(), subject)
		if err != nil {
			t.Fatal(err)
		}
		if v, err := e.v.VerifyManifest(WithMaxDeclared(t.Context(), 1<<20), subject, raw); !errors.Is(err, ErrLarge) {
			t.Errorf("%s under a 1 MiB limit: %+v, %v; want ErrLarge", what, v, err)
		}
		if v, err := e.v.VerifyManifest(t.Context(), subject, raw); err != nil || v == nil {
			t.Errorf("%s without a limit: %+v, %v; want a verdict", what, v, err)
		}
	}
}
