package registry

import (
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// progressLog records progress calls: how many, the last one, and whether
// done ever shrank or passed the total.
type progressLog struct {
	mu          sync.Mutex
	calls       int
	done, total int64
	bad         bool
}

func (l *progressLog) report(done, total int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls++
	if done < l.done || done > total {
		l.bad = true
	}
	l.done, l.total = done, total
}

func (l *progressLog) finished(t *testing.T, what string) int64 {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.calls == 0 {
		t.Fatalf("%s: progress was never reported", what)
	}
	if l.bad {
		t.Errorf("%s: done shrank or passed the total", what)
	}
	if l.done != l.total {
		t.Errorf("%s: last report %d/%d, want done equal to the total", what, l.done, l.total)
	}
	return l.total
}

// TestCopyProgress: Copy reports the bytes it copies, of an image and of
// an index, to another registry; a copy dst already holds reports
// without hanging, and a failing one returns.
func TestCopyProgress(t *testing.T) {
	from, to := testRegistry(t), testRegistry(t)
	c := testClient(t)
	img, err := random.Image(1<<20, 3)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := random.Index(256<<10, 2, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(mustTag(t, from+"/acme/img:1"), img); err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(mustTag(t, from+"/acme/idx:1"), idx); err != nil {
		t.Fatal(err)
	}
	for _, repo := range []string{"img", "idx"} {
		t.Run(repo, func(t *testing.T) {
			src := mustTag(t, from+"/acme/"+repo+":1")
			dst := mustTag(t, to+"/acme/"+repo+":1")
			var log progressLog
			if _, err := c.Copy(t.Context(), src, dst, CopyOptions{Progress: log.report}); err != nil {
				t.Fatal(err)
			}
			// Three layers of 1 MiB, or two images of two 256 KiB layers.
			if total := log.finished(t, "copy"); total < 1<<20 {
				t.Errorf("total %d bytes, less than the layers copied", total)
			}
			// dst holds it all now: nothing to send, and nothing to wait for.
			var again progressLog
			if _, err := c.Copy(t.Context(), src, dst, CopyOptions{Progress: again.report}); err != nil {
				t.Fatal(err)
			}
		})
	}
	bad, err := name.NewTag("127.0.0.1:1/acme/img:1", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	var log progressLog
	fast := testClient(t, WithRetry(1, 1))
	if _, err := fast.Copy(t.Context(), mustTag(t, from+"/acme/img:1"), bad, CopyOptions{Progress: log.report}); err == nil {
		t.Error("copy to an unreachable registry succeeded")
	}
}
