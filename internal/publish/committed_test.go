package publish

import (
	"context"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"

	"github.com/imagepipe/imagepipe/internal/containerdisk"
	"github.com/imagepipe/imagepipe/internal/disktest"
)

// TestStoppedBeforeTheManifestSendsNoLayerAgain: an import stopped (Ctrl-C)
// after its layer was committed and before its manifest was put does not
// upload the layer again on the next run; it publishes the same image a
// fresh build makes.
func TestStoppedBeforeTheManifestSendsNoLayerAgain(t *testing.T) {
	var stop atomic.Pointer[context.CancelFunc]
	var blobWrites atomic.Int64
	inner := ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "/blobs/uploads/") && (r.Method == http.MethodPatch || r.Method == http.MethodPut) {
			blobWrites.Add(1)
		}
		if cancel := stop.Load(); cancel != nil && r.Method == http.MethodPut && strings.Contains(r.URL.Path, "/manifests/") {
			(*cancel)() // the user's Ctrl-C, while the manifest is on its way
			http.Error(w, "interrupted", http.StatusServiceUnavailable)
			return
		}
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	host := u.Host
	src := disktest.Disk(t, 4<<20, 7)
	c := testClient(t)

	ctx, cancel := context.WithCancel(t.Context())
	stop.Store(&cancel)
	if _, err := c.Import(ctx, disktest.MustTag(t, host+"/acme/disk:1"), src.ContainerDisk(t, containerdisk.Options{}), src, ImportOptions{}); err == nil {
		t.Fatal("the interrupted import succeeded")
	}
	if blobWrites.Load() == 0 {
		t.Fatal("the interrupted import sent no layer; the test stopped it too early")
	}
	stop.Store(nil)
	blobWrites.Store(0)

	res, err := c.Import(t.Context(), disktest.MustTag(t, host+"/acme/disk:1"), src.ContainerDisk(t, containerdisk.Options{}), src, ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n := blobWrites.Load(); n != 0 || res.UploadedBytes != 0 {
		t.Errorf("the next run sent %d layer requests, %d bytes; want none", n, res.UploadedBytes)
	}
	fresh, err := testClient(t).Import(t.Context(), disktest.MustTag(t, host+"/acme/fresh:1"), src.ContainerDisk(t, containerdisk.Options{}), src, ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Digest != fresh.Digest {
		t.Errorf("the resumed run published %s, a fresh build %s", res.Digest, fresh.Digest)
	}
}
