package diskimage

import (
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/imagepipe/imagepipe/internal/containerdisk"
	"github.com/imagepipe/imagepipe/internal/registry"
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

// TestExtractProgress: Extract reports the compressed layer's bytes
// pulled, up to the size the manifest gives.
func TestExtractProgress(t *testing.T) {
	host := testRegistry(t)
	c := testClient(t)
	src := testDisk(t, 8<<20, 7)
	res, err := c.Import(t.Context(), mustTag(t, host+"/acme/disk:1"), src.disk(t, containerdisk.Options{}), src, registry.ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ref := mustReference(t, c, res.Pinned)
	var log progressLog
	if _, err := Extract(t.Context(), c, ref, &discard{}, ExtractOptions{Progress: log.report}); err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(ref)
	if err != nil {
		t.Fatal(err)
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if got := log.finished(t, "extract"); got != m.Layers[0].Size {
		t.Errorf("total %d, want the layer's %d bytes", got, m.Layers[0].Size)
	}
}

// discard is an io.Writer that keeps nothing.
type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
