package registry

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/opencontainers/go-digest"

	"github.com/imagepipe/imagepipe/internal/disktest"
)

// denyingRegistry is go-containerregistry's registry behind a policy that
// answers 403 DENIED, as Harbor or a cloud registry does for credentials
// that may pull but not push: to every POST, PATCH and PUT under
// /v2/acme/locked/, to manifest PUTs under /v2/acme/sealed/ (its blobs go
// in), and to the PUT that completes a blob upload under /v2/acme/full/
// (Harbor's answer when a quota is exceeded). It counts the requests it
// denies by method, repository and kind (blobs, manifests).
type denyingRegistry struct {
	inner http.Handler

	mu     sync.Mutex
	denied map[string]int // "METHOD /v2/REPO/KIND" → requests denied
}

func (d *denyingRegistry) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	write := r.Method == http.MethodPost || r.Method == http.MethodPatch || r.Method == http.MethodPut
	p := r.URL.Path
	if write && (strings.HasPrefix(p, "/v2/acme/locked/") || strings.HasPrefix(p, "/v2/acme/sealed/manifests/") ||
		(r.Method == http.MethodPut && strings.HasPrefix(p, "/v2/acme/full/blobs/"))) {
		key := r.Method + " " + p
		for _, kind := range []string{"/blobs/", "/manifests/"} {
			if i := strings.Index(p, kind); i >= 0 {
				key = r.Method + " " + p[:i+len(kind)-1]
			}
		}
		d.mu.Lock()
		d.denied[key]++
		d.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		io.WriteString(w, `{"errors":[{"code":"DENIED","message":"requested access to the resource is denied"}]}`)
		return
	}
	d.inner.ServeHTTP(w, r)
}

// TestDeniedPushSaysSoAndIsNotRetried: a registry that answers a push
// with 403 DENIED, when the upload starts, when it completes or at the
// manifest, fails the push with the registry's answer (a
// *transport.Error, for the request refused, which imagectl explains),
// after one request for each thing the registry refused: a denial is not
// a transient failure, and retrying it only delays the answer.
func TestDeniedPushSaysSoAndIsNotRetried(t *testing.T) {
	// Retries with a backoff short enough that a retried denial shows in
	// the counts, not in the test's duration.
	c := testClient(t, WithBasicAuth("tenant", "pw"), WithRetry(4, time.Millisecond))
	blob := bytes.Repeat([]byte("imagepipe"), 100000)
	img, err := random.Image(512, 1)
	if err != nil {
		t.Fatal(err)
	}
	uploadTo := func(t *testing.T, ref string) error {
		_, err := c.Upload(t.Context(), disktest.MustTag(t, ref).Context(), Blob{Write: func(ctx context.Context, w io.Writer) (string, map[string]string, error) {
			_, err := w.Write(blob)
			return digest.FromBytes(blob).String(), nil, err
		}})
		return err
	}
	pushTo := func(t *testing.T, ref string) error {
		_, err := c.Push(t.Context(), disktest.MustTag(t, ref), img)
		return err
	}

	for _, tc := range []struct {
		name string
		push func(t *testing.T, ref string) error
		ref  string         // where to push, after the registry's host
		says string         // the repository or reference the error names, after the host
		want map[string]int // the requests denied: at least one, at most this many
	}{
		{"upload/open", uploadTo, "/acme/locked:v1", "/acme/locked", map[string]int{"POST /v2/acme/locked/blobs": 1}},
		{"upload/commit", uploadTo, "/acme/full:v1", "/acme/full", map[string]int{"PUT /v2/acme/full/blobs": 1}},
		// The config and the layer start their uploads in parallel.
		{"push/upload", pushTo, "/acme/locked:v2", "/acme/locked", map[string]int{"POST /v2/acme/locked/blobs": 2}},
		{"push/manifest", pushTo, "/acme/sealed:v2", "/acme/sealed:v2", map[string]int{"PUT /v2/acme/sealed/manifests": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &denyingRegistry{inner: ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0))), denied: map[string]int{}}
			srv := httptest.NewServer(d)
			t.Cleanup(srv.Close)
			host := strings.TrimPrefix(srv.URL, "http://")
			err := tc.push(t, host+tc.ref)
			if err == nil {
				t.Fatal("the push succeeded")
			}
			var terr *transport.Error
			repo, _, _ := strings.Cut(tc.says, ":")
			if !errors.As(err, &terr) || terr.StatusCode != http.StatusForbidden || terr.Request == nil ||
				terr.Request.URL.Host != host || !strings.HasPrefix(terr.Request.URL.Path, "/v2"+repo+"/") {
				t.Errorf("%v: not the registry's denial of a request to %s", err, host+repo)
			}
			srv.Close() // waits for requests the client gave up on
			for k, n := range tc.want {
				if got := d.denied[k]; got < 1 || got > n {
					t.Errorf("%s: %d denied, want 1 to %d", k, got, n)
				}
			}
			for k, n := range d.denied {
				if _, ok := tc.want[k]; !ok {
					t.Errorf("%s: %d denied, want none", k, n)
				}
			}
		})
	}
}
