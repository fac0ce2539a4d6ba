package gate

import (
	"bufio"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/opencontainers/go-digest"

	"github.com/imagepipe/imagepipe/internal/containerdisk"
	"github.com/imagepipe/imagepipe/internal/publish"
	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/internal/reject"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// TestMain lets this test binary play a verification child when
// PLAY_GATE_CHILD is set: it reads its task from its standard input
// (ReadTask) and prints an accepted verdict on the subject, when the
// manifest given is the subject's; standard input ending first, it exits
// 3. With PLAY_GATE_CHILD=spin it reads a line, then spins on the cores
// instead, in several threads, until it is killed: a verification of a
// disk built to cost. With PLAY_GATE_CHILD=lane, a subject in a
// repository of a tenant named huge… is an image declaring 8 GiB: under a
// limit (Task.MaxDeclared) the child exits ExitLarge at once, else it
// sleeps until it is killed, a long verification.
func TestMain(m *testing.M) {
	switch os.Getenv("PLAY_GATE_CHILD") {
	case "":
		os.Exit(m.Run())
	case "inspect-hog", "inspect-spin":
		playInspector(os.Getenv("PLAY_GATE_CHILD"))
	case "crash":
		if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
			os.Exit(3)
		}
		b := make([]byte, 1<<47) // a length an image declared: no recover catches it
		b[len(b)-1] = 1
	case "spin":
		if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
			os.Exit(3)
		}
		for range 3 {
			go func() {
				for n := 0; ; n++ {
				}
			}()
		}
		select {}
	}
	task, ok, err := ReadTask(os.Stdin)
	d, manifest := task.Subject, task.Manifest
	switch {
	case !ok:
		os.Exit(3)
	case err != nil || manifest.Digest != d.DigestStr():
		os.Exit(4)
	case os.Getenv("PLAY_GATE_CHILD") == "lane" && strings.HasPrefix(d.RepositoryStr(), "huge"):
		if task.MaxDeclared > 0 && task.MaxDeclared < 8<<30 {
			os.Exit(ExitLarge)
		}
		time.Sleep(time.Hour)
	}
	_ = json.NewEncoder(os.Stdout).Encode(api.Verdict{Subject: d.DigestStr(), Repository: d.RepositoryStr(), Verdict: api.VerdictAccepted})
	os.Exit(0)
}

// playInspector plays an Inspector's process whose guest readers run
// away: it sets the bounds its flags name as inspect-one does, then
// holds ever more memory (hog) or spins (spin) until they stop it.
func playInspector(mode string) {
	var memory int64
	var cpu time.Duration
	for i, a := range os.Args {
		switch {
		case a == "--memory-limit" && i+1 < len(os.Args):
			memory, _ = strconv.ParseInt(os.Args[i+1], 10, 64)
		case a == "--cpu-limit" && i+1 < len(os.Args):
			cpu, _ = time.ParseDuration(os.Args[i+1])
		}
	}
	if err := LimitInspection(memory, cpu); err != nil {
		os.Exit(5)
	}
	for n := 0; ; n++ {
		if mode == "inspect-hog" && n < 1<<16 {
			b := make([]byte, 1<<20)
			b[n%len(b)] = 1
			heldByInspector = append(heldByInspector, b)
		}
	}
}

// heldByInspector keeps what the hog holds reachable.
var heldByInspector [][]byte

// playedSubject is a subject for a played child, with its manifest.
func playedSubject(t *testing.T) (name.Digest, *registry.RawManifest) {
	t.Helper()
	b := []byte(`{"schemaVersion":2}`)
	subject, err := name.NewDigest("registry.example/acme/rhel@" + digest.FromBytes(b).String())
	if err != nil {
		t.Fatal(err)
	}
	return subject, &registry.RawManifest{Digest: subject.DigestStr(), MediaType: types.OCIManifestSchema1, Bytes: b}
}

// TestChildKeepsASpareStarted: a verification's child is started before
// the verification is asked for, a spare that died waiting is replaced,
// and Close stops the spare.
func TestChildKeepsASpareStarted(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("PLAY_GATE_CHILD", "1")
	c := &Child{Path: exe, TempDir: t.TempDir()}
	c.refill()
	if c.spare == nil {
		t.Fatal("no child started before the first verification")
	}
	if err := c.spare.cmd.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("the spare is not running: %v", err)
	}
	subject, manifest := playedSubject(t)
	for i := range 3 {
		v, _, err := c.Verify(t.Context(), subject, manifest)
		if err != nil || v.Subject != subject.DigestStr() {
			t.Fatalf("verification %d: %+v, %v", i, v, err)
		}
	}

	// The spare dies while it waits: the next verification starts its own.
	c.mu.Lock()
	for c.spare == nil {
		c.mu.Unlock()
		c.refill()
		c.mu.Lock()
	}
	spare := c.spare
	c.mu.Unlock()
	if err := spare.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-spare.done
	if v, _, err := c.Verify(t.Context(), subject, manifest); err != nil || v.Verdict != api.VerdictAccepted {
		t.Fatalf("after the spare died: %+v, %v", v, err)
	}

	c.refill()
	c.mu.Lock()
	spare = c.spare
	c.mu.Unlock()
	c.Close()
	if spare == nil {
		t.Fatal("no spare before Close")
	}
	select {
	case <-spare.done:
	default:
		t.Fatal("Close returned with the spare still running")
	}
	if c.Verify(t.Context(), subject, manifest); c.spare != nil {
		t.Error("a verification after Close left a spare")
	}
}

// TestACPUBoundVerificationIsRefusedAtItsLimit: a verification that
// spins past its CPU limit is killed by the kernel and the image refused
// at once (verification-limit), not retried; its CPU time is charged to
// its tenant, whose next verification then waits.
func TestACPUBoundVerificationIsRefusedAtItsLimit(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("PLAY_GATE_CHILD", "spin")
	e := newEnv(t)
	signer := newSigner(t)
	s, _ := e.service(t, signer)
	s.Isolated = &Child{Path: exe, TempDir: t.TempDir(), CPULimit: time.Second}
	s.Budget = Budget{Window: time.Hour, Cost: Cost{CPU: 500 * time.Millisecond}}
	d := e.importDisk(t, "acme/spin", rawDisk(t, 1<<20, 11), containerdisk.Options{}, publish.ImportOptions{})
	v, err := s.Handle(t.Context(), mustDigest(t, e.host+"/acme/spin@"+d))
	if err != nil || v.Verdict != api.VerdictRejected || v.Reasons[0].Code != string(reject.VerificationLimit) {
		t.Fatalf("%+v, %v; want refused for the verification limit", v, err)
	}
	if !strings.Contains(v.Reasons[0].Message, "CPU time") {
		t.Errorf("the refusal does not say which limit: %s", v.Reasons[0].Message)
	}
	if w := s.spent.wait("acme"); w <= 0 {
		t.Errorf("after a second of CPU on a budget of half a second, acme waits %s", w)
	}
	if w := s.spent.wait("globex"); w != 0 {
		t.Errorf("another tenant waits %s", w)
	}
}

// TestAVerificationThatCrashesIsRefusedAfterThreeTries: a child that a
// Go runtime error ends (here an allocation of 2^47 bytes, which no
// recover catches) costs a retry, and on the third crash in a row the
// image is refused, with the runtime's message (out of memory; under the
// race detector, its own allocator's), instead of being
// verified again for ever.
func TestAVerificationThatCrashesIsRefusedAfterThreeTries(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("PLAY_GATE_CHILD", "crash")
	e := newEnv(t)
	s, _ := e.service(t, newSigner(t))
	s.Isolated = &Child{Path: exe, TempDir: t.TempDir()}
	d := e.importDisk(t, "acme/crash", rawDisk(t, 1<<20, 12), containerdisk.Options{}, publish.ImportOptions{})
	subject := mustDigest(t, e.host+"/acme/crash@"+d)
	for try := 1; try < MaxOverLimit; try++ {
		if v, err := s.Handle(t.Context(), subject); !errors.Is(err, ErrCrashed) || v != nil {
			t.Fatalf("crash %d: %+v, %v; want ErrCrashed and no verdict yet", try, v, err)
		}
	}
	v, err := s.Handle(t.Context(), subject)
	if err != nil || v.Verdict != api.VerdictRejected || v.Reasons[0].Code != string(reject.VerificationLimit) ||
		!strings.Contains(v.Reasons[0].Message, "crashed (fatal error: ") {
		t.Fatalf("crash %d: %+v, %v; want refused, saying it crashed and why", MaxOverLimit, v, err)
	}
}

// TestReniceLowersEveryThread: a long verification's priority is lowered
// in each of its threads, not only its first (Linux keeps one per thread).
func TestReniceLowersEveryThread(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), "PLAY_GATE_CHILD=spin")
	cmd.Stdin = strings.NewReader("registry.example/acme/rhel@sha256:" + strings.Repeat("1", 64) + "\n")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	pid := cmd.Process.Pid
	// The spinning threads start after the subject is read: wait for them.
	for tasks(t, pid) < 4 {
		runtime.Gosched()
	}
	if err := renice(pid, 15); err != nil {
		t.Fatal(err)
	}
	taskDir := "/proc/" + strconv.Itoa(pid) + "/task"
	entries, err := os.ReadDir(taskDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(taskDir + "/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if f[16] != "15" {
			t.Errorf("thread %s has nice %s, want 15", e.Name(), f[16])
		}
	}
	if cpu, err := cpuTime(pid); err != nil || cpu < 0 {
		t.Errorf("CPU time of the child: %s, %v", cpu, err)
	}
	prev := 0
	for _, cpu := range []time.Duration{0, time.Second, 3 * time.Second, time.Minute, time.Hour} {
		if n := niceAfter(cpu); n < prev || n > 19 {
			t.Errorf("niceAfter(%s) = %d after %d: priorities only fall, within nice's range", cpu, n, prev)
		} else {
			prev = n
		}
	}
	if niceAfter(0) != 0 || niceAfter(time.Hour) != 19 {
		t.Error("a new verification must run at full priority, a long one at the lowest")
	}
}

func tasks(t *testing.T, pid int) int {
	entries, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}

// TestTheSpoolBoundRefusesADiskWithTooMuchData: a disk whose data passes
// the spool bound of one verification is refused, not written on until
// the disk is full.
func TestTheSpoolBoundRefusesADiskWithTooMuchData(t *testing.T) {
	e := newEnv(t)
	e.v.MaxSpool = 64 << 10 // the disk holds 192 KiB of data
	d := craftImage(t, rawDisk(t, 4<<20, 12)).push(t, e, "acme/fat")
	v := e.verify(t, "acme/fat", d)
	if v.Verdict != api.VerdictRejected || v.Reasons[0].Code != string(reject.VerificationLimit) {
		t.Fatalf("%+v; want refused for the verification limit", v)
	}
	if spent := e.v.Spent(); spent.Spooled > 1<<20 {
		t.Errorf("spooled %d bytes before refusing, for a bound of %d", spent.Spooled, e.v.MaxSpool)
	}
	e.v.MaxSpool = 0
	if v := e.verify(t, "acme/fat", d); v.Verdict != api.VerdictAccepted {
		t.Errorf("without a bound: %+v", v)
	}
}

// A task of a subject alone (verify-one run by hand) has no manifest: the
// child fetches it; a task that ends inside its media type line is still
// an error, never a task without a manifest by accident.
func TestReadTaskOfASubjectAlone(t *testing.T) {
	subject := "registry.example/acme/rhel@sha256:" + strings.Repeat("1", 64)
	task, ok, err := ReadTask(strings.NewReader(subject + "\n"))
	if err != nil || !ok || task.Manifest != nil || task.Subject.String() != subject {
		t.Errorf("a subject alone: %+v %v %v; want the subject and no manifest", task, ok, err)
	}
	if _, _, err := ReadTask(strings.NewReader(subject + "\napplication/vnd.oci")); err == nil {
		t.Error("a task cut inside its media type line was read")
	}
	if _, _, err := ReadTask(strings.NewReader(subject + "\napplication/vnd.oci\n12")); err == nil {
		t.Error("a task cut inside its limit line was read")
	}
	if _, ok, err := ReadTask(strings.NewReader("")); ok || err != nil {
		t.Errorf("an empty task: ok %v, %v; want a spare child's quiet end", ok, err)
	}
}
