package diskimage

import (
	"testing"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/imagepipe/imagepipe/internal/imageref"
	"github.com/imagepipe/imagepipe/internal/publish"
	"github.com/imagepipe/imagepipe/internal/registry"
)

func testClient(t *testing.T, opts ...registry.Option) *registry.Client {
	t.Helper()
	c, err := registry.New(append([]registry.Option{registry.WithCacheDir(t.TempDir())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// mustReference parses s in FormImage and converts it to
// go-containerregistry's name.
func mustReference(t *testing.T, s string) name.Reference {
	t.Helper()
	r, err := imageref.Parse(s, imageref.FormImage)
	if err != nil {
		t.Fatal(err)
	}
	n, err := registry.Names{}.Reference(r)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// importer imports with c, keeping no build records.
func importer(c *registry.Client) *publish.Importer {
	return &publish.Importer{Registry: c}
}
