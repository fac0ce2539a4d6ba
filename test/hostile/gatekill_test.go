package hostile

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// TestKilledGateLeavesNoVerificationRunning: a gate killed with SIGKILL
// while a verification child spools a disk takes its children with it,
// and a gate started again on the same --temp-dir removes the dead gate's
// folder. The gate reads the registry through a proxy that stops a layer
// download after 1 MiB, so the child is known to be mid-spool when the
// gate is killed.
func TestKilledGateLeavesNoVerificationRunning(t *testing.T) {
	reg := harness.StartRegistry(t, harness.RegistryOptions{})
	stall := startStallingProxy(t, reg.Host, 1<<20)
	tmp := t.TempDir()
	g := harness.ReserveGate(t)
	g.Start(t, testenv.ImageGate, stall.host, "", "", "", "--temp-dir", tmp)

	disk := make([]byte, 8<<20) // random bytes: a raw disk that is spooled, not streamed
	rand.Read(disk)
	ref, err := name.NewTag(reg.Host+"/acme/killed:1", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	pushContainerDisk(t, ref, disk)

	select {
	case <-stall.reached:
	case <-time.After(time.Minute):
		t.Fatal("the gate did not start downloading the layer within a minute")
	}
	folders := gateFolders(t, tmp)
	if len(folders) != 1 {
		t.Fatalf("gate folders %v in the temp dir; want one", folders)
	}
	harness.WaitUntil(t, "the verification child to spool the disk", 30*time.Second, 20*time.Millisecond, func() (bool, error) {
		spools, err := filepath.Glob(filepath.Join(folders[0], "verify-*", "*"))
		for _, s := range spools {
			if fi, err := os.Stat(s); err == nil && fi.Size() > 0 {
				return true, nil
			}
		}
		return false, err
	})
	children := childrenOf(t, g.Pid(), "verify-one")
	if len(children) == 0 {
		t.Fatal("the gate runs no verification child")
	}

	g.Kill(t)
	harness.WaitUntil(t, "the gate's verification children to die with it", 10*time.Second, 20*time.Millisecond, func() (bool, error) {
		for _, c := range children {
			if c.running() {
				return false, nil
			}
		}
		return true, nil
	})
	if _, err := os.Stat(folders[0]); err != nil {
		t.Fatalf("the killed gate's folder is gone before a gate starts again: %v", err)
	}

	again := harness.ReserveGate(t)
	again.Start(t, testenv.ImageGate, reg.Host, "", "", "", "--temp-dir", tmp)
	if _, err := os.Stat(folders[0]); !os.IsNotExist(err) {
		t.Errorf("the killed gate's folder %s is still there after a gate started on the same temp dir (%v)", folders[0], err)
	}
	if now := gateFolders(t, tmp); len(now) != 1 || now[0] == folders[0] {
		t.Errorf("gate folders %v; want the running gate's only", now)
	}
}

// gateFolders lists the gates' folders in tmp.
func gateFolders(t *testing.T, tmp string) []string {
	t.Helper()
	folders, err := filepath.Glob(filepath.Join(tmp, "image-gate-*"))
	if err != nil {
		t.Fatal(err)
	}
	return folders
}

// process is one process as /proc showed it: its start time tells it
// from a later process that reuses the pid.
type process struct {
	pid   int
	start string
}

// running reports whether the process still runs: it is neither gone
// nor a zombie.
func (p process) running() bool {
	state, start, ok := procStat(p.pid)
	return ok && start == p.start && state != "Z"
}

// procStat reads the state and start time of pid from /proc/PID/stat.
func procStat(pid int) (state, start string, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", "", false
	}
	// The command, in parentheses, may hold spaces: fields follow its end.
	fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(fields) < 20 {
		return "", "", false
	}
	return fields[0], fields[19], true // state (field 3) and starttime (field 22)
}

// childrenOf lists the processes whose parent is pid and whose command
// line holds arg.
func childrenOf(t *testing.T, pid int, arg string) []process {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var found []process
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		status, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil || !bytes.Contains(status, []byte("\nPPid:\t"+strconv.Itoa(pid)+"\n")) {
			continue
		}
		cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !bytes.Contains(cmdline, []byte("\x00"+arg+"\x00")) {
			continue
		}
		if _, start, ok := procStat(child); ok {
			found = append(found, process{child, start})
		}
	}
	return found
}

// stallingProxy forwards HTTP requests to a registry and holds every
// response of more than limit bytes after its first limit bytes, until
// the client goes away or the test ends.
type stallingProxy struct {
	host    string        // 127.0.0.1:PORT
	reached chan struct{} // closed when a response is first held
}

func startStallingProxy(t *testing.T, target string, limit int64) *stallingProxy {
	t.Helper()
	p := &stallingProxy{reached: make(chan struct{})}
	ended := make(chan struct{})
	var once sync.Once
	rp := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: target})
	rp.ModifyResponse = func(resp *http.Response) error {
		if resp.Request.Method != http.MethodGet || resp.ContentLength <= limit {
			return nil
		}
		resp.Body = &stallingBody{ReadCloser: resp.Body, left: limit, ctx: resp.Request.Context(), ended: ended, held: func() {
			once.Do(func() { close(p.reached) })
		}}
		return nil
	}
	// The held copies end in errors, by design.
	rp.ErrorLog = log.New(io.Discard, "", 0)
	// Bytes pass on as they come, so that the client gets the first limit.
	rp.FlushInterval = -1
	srv := httptest.NewServer(rp)
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(ended) }) // runs first: held responses end, then the server closes
	p.host = strings.TrimPrefix(srv.URL, "http://")
	return p
}

// stallingBody passes left bytes, then blocks until ctx or ended is done.
type stallingBody struct {
	io.ReadCloser
	left  int64
	ctx   context.Context
	ended <-chan struct{}
	held  func()
}

func (b *stallingBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		b.held()
		select {
		case <-b.ctx.Done():
			return 0, b.ctx.Err()
		case <-b.ended:
			return 0, io.ErrUnexpectedEOF
		}
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	return n, err
}
