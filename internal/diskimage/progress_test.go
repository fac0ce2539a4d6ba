package diskimage

import (
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/imagepipe/imagepipe/internal/containerdisk"
	"github.com/imagepipe/imagepipe/internal/disktest"
	"github.com/imagepipe/imagepipe/internal/publish"
)

// TestExtractProgress: Extract reports the compressed layer's bytes
// pulled, up to the size the manifest gives.
func TestExtractProgress(t *testing.T) {
	host := disktest.Registry(t)
	c := testClient(t)
	src := disktest.Disk(t, 8<<20, 7)
	res, err := importer(c).Import(t.Context(), disktest.MustTag(t, host+"/acme/disk:1"), src.ContainerDisk(t, containerdisk.Options{}), src, publish.ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ref := mustReference(t, res.Pinned)
	var log disktest.Progress
	if _, err := Extract(t.Context(), c, ref, &discard{}, ExtractOptions{Progress: log.Report}); err != nil {
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
	if got := log.Finished(t, "extract"); got != m.Layers[0].Size {
		t.Errorf("total %d, want the layer's %d bytes", got, m.Layers[0].Size)
	}
}

// discard is an io.Writer that keeps nothing.
type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
