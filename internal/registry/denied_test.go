package registry

import (
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/imagepipe/imagepipe/internal/containerdisk"
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
// manifest, makes imagectl say that the user may not push to the
// repository, as a denial (ErrDenied, which imagectl reports with code
// "denied"), after one request for each thing the registry refused: a
// denial is not a transient failure, and retrying it only delays the
// answer.
func TestDeniedPushSaysSoAndIsNotRetried(t *testing.T) {
	// Retries with a backoff short enough that a retried denial shows in
	// the counts, not in the test's duration.
	c := testClient(t, WithBasicAuth("tenant", "pw"), WithRetry(4, time.Millisecond))
	src := testDisk(t, 1<<20, 3)
	img, err := random.Image(512, 1)
	if err != nil {
		t.Fatal(err)
	}
	importTo := func(t *testing.T, ref string) error {
		_, err := c.Import(t.Context(), mustTag(t, ref), src.disk(t, containerdisk.Options{}), src, ImportOptions{})
		return err
	}
	pushTo := func(t *testing.T, ref string) error {
		_, err := c.PushImage(t.Context(), mustTag(t, ref), img)
		return err
	}

	for _, tc := range []struct {
		name string
		push func(t *testing.T, ref string) error
		ref  string         // where to push, after the registry's host
		says string         // the repository or reference the error names, after the host
		want map[string]int // the requests denied: at least one, at most this many
	}{
		{"import/upload", importTo, "/acme/locked:v1", "/acme/locked", map[string]int{"POST /v2/acme/locked/blobs": 1}},
		{"import/commit", importTo, "/acme/full:v1", "/acme/full", map[string]int{"PUT /v2/acme/full/blobs": 1}},
		{"import/manifest", importTo, "/acme/sealed:v1", "/acme/sealed:v1", map[string]int{"PUT /v2/acme/sealed/manifests": 1}},
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
			// What cmd/imagectl does with a registry command's error.
			explained := c.Explain(err, errors.Is(err, ErrResumable))
			if !errors.Is(explained, ErrDenied) {
				t.Errorf("%v: not ErrDenied", explained)
			}
			if want := `user "tenant" may not push to ` + host + tc.says; !strings.Contains(explained.Error(), want) {
				t.Errorf("%q does not say %q", explained, want)
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

// TestDeniedSaysWhoAndWhatTheRegistrySaid: a denial names the user, or says
// that none was sent, and carries the registry's own reason (a quota)
// when it says more than the stock sentence.
func TestDeniedSaysWhoAndWhatTheRegistrySaid(t *testing.T) {
	req, err := http.NewRequest(http.MethodPut, "https://registry.example/v2/acme/rhel/manifests/9", nil)
	if err != nil {
		t.Fatal(err)
	}
	denied := func(msg string) error {
		return &transport.Error{StatusCode: http.StatusForbidden, Request: req,
			Errors: []transport.Diagnostic{{Code: transport.DeniedErrorCode, Message: msg}}}
	}
	anon, err := New(withKeychain(authn.NewMultiKeychain()), WithCacheDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		c       *Client
		msg     string
		want    []string
		notWant string
	}{
		{testClient(t, WithBasicAuth("tenant", "pw")), "storage quota exceeded for project acme\x1b[2J",
			[]string{`access denied: user "tenant" may not push to`, "(the registry says: storage quota exceeded for project acme [2J)"}, "\x1b"},
		{testClient(t, WithBasicAuth("tenant", "pw")), "requested access to the resource is denied",
			[]string{`access denied: user "tenant" may not push to`}, "registry says"},
		{anon, "", []string{"access denied: an anonymous user (no credentials for registry.example) may not push to"}, `user ""`},
	}
	for _, tc := range tests {
		got := tc.c.Explain(denied(tc.msg), false)
		if !errors.Is(got, ErrDenied) {
			t.Errorf("%q: %v, not ErrDenied", tc.msg, got)
		}
		for _, w := range tc.want {
			if !strings.Contains(got.Error(), w) {
				t.Errorf("%q: %q does not say %q", tc.msg, got, w)
			}
		}
		if strings.Contains(got.Error(), tc.notWant) {
			t.Errorf("%q: %q says %q", tc.msg, got, tc.notWant)
		}
	}
}
