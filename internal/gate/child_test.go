package gate

import (
	"bufio"
	"encoding/json"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/imagepipe/imagepipe/pkg/api"
)

// TestMain lets this test binary play a verification child when
// PLAY_GATE_CHILD is set: it reads a subject from its standard input and
// prints an accepted verdict on it; standard input ending first, it exits 3.
func TestMain(m *testing.M) {
	if os.Getenv("PLAY_GATE_CHILD") != "" {
		line, err := bufio.NewReader(os.Stdin).ReadString('\n')
		if err != nil {
			os.Exit(3)
		}
		d, err := name.NewDigest(strings.TrimSpace(line))
		if err != nil {
			os.Exit(4)
		}
		_ = json.NewEncoder(os.Stdout).Encode(api.Verdict{Subject: d.DigestStr(), Repository: d.RepositoryStr(), Verdict: api.VerdictAccepted})
		os.Exit(0)
	}
	os.Exit(m.Run())
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
	subject, err := name.NewDigest("registry.example/acme/rhel@sha256:" + strings.Repeat("1", 64))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		v, err := c.Verify(t.Context(), subject)
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
	if v, err := c.Verify(t.Context(), subject); err != nil || v.Verdict != api.VerdictAccepted {
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
	if c.Verify(t.Context(), subject); c.spare != nil {
		t.Error("a verification after Close left a spare")
	}
}
