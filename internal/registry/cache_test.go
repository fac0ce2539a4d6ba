package registry

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/opencontainers/go-digest"

	"github.com/imagepipe/imagepipe/internal/disktest"
)

// TestForgedUploadStateNeverSendsElsewhere plants an upload state file
// whose session URL is on another host: the upload ignores it, sends
// nothing there, and completes on the registry named by the repository.
func TestForgedUploadStateNeverSendsElsewhere(t *testing.T) {
	host := disktest.Registry(t)
	var elsewhere atomic.Int64
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
		w.Header().Set("Range", "0-0")
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(evil.Close)

	cache := t.TempDir()
	dir := filepath.Join(cache, "uploads")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	plant := func(t *testing.T, repo name.Repository, key, location string) {
		t.Helper()
		b, _ := json.Marshal(uploadState{Key: key, Repo: repo.Name(), Location: location})
		if err := os.WriteFile(filepath.Join(dir, stateFileName(repo.Name(), key)), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	upload := func(t *testing.T, c *Client, repo name.Repository, key string, seed byte) Uploaded {
		t.Helper()
		blob := bytes.Repeat([]byte{seed}, 4<<20)
		up, err := c.Upload(t.Context(), repo, Blob{Key: func() string { return key }, Write: func(ctx context.Context, w io.Writer) (string, map[string]string, error) {
			_, err := w.Write(blob)
			return digest.FromBytes(blob).String(), nil, err
		}})
		if err != nil {
			t.Fatal(err)
		}
		if up.Sent != int64(len(blob)) || up.Earlier {
			t.Errorf("upload %+v: the whole blob should have gone to the registry", up)
		}
		return up
	}

	c := testClient(t, WithCacheDir(cache))
	repo := disktest.MustTag(t, host+"/acme/state:1").Context()
	plant(t, repo, "key-1", evil.URL+"/v2/acme/state/blobs/uploads/forged")
	upload(t, c, repo, "key-1", 1)
	if n := elsewhere.Load(); n != 0 {
		t.Errorf("%d requests went to the host the state file named", n)
	}

	// On the same registry, a session of another tenant's repository is
	// not resumed either.
	var paths []string
	var mu sync.Mutex
	c2 := testClient(t, WithCacheDir(cache), WithRequestObserver(func(method, path string, status int) {
		mu.Lock()
		paths = append(paths, method+" "+path)
		mu.Unlock()
	}))
	for i, loc := range []string{"http://" + host + "/v2/globex/evil/blobs/uploads/forged", "/v2/acme/state/blobs/uploads/../../../globex/evil/blobs/uploads/x"} {
		key := fmt.Sprintf("key-%d", 10+i)
		plant(t, repo, key, loc)
		upload(t, c2, repo, key, byte(10+i))
		mu.Lock()
		for _, p := range paths {
			if strings.Contains(p, "globex") {
				t.Errorf("state file location %s: request %s", loc, p)
			}
		}
		paths = nil
		mu.Unlock()
	}
}

// TestCheckAccessSaysWhy: CheckAccess of a repository fails with the registry's answer (which
// imagectl explains) for a registry that refuses the push (played by a handler: distribution has no per-repository
// permissions), one that wants credentials, and accepts an open registry,
// deleting the session it opened.
func TestCheckAccessSaysWhy(t *testing.T) {
	var deleted atomic.Int64
	denying := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/v2/":
			w.WriteHeader(http.StatusOK)
		case r.Method == http.MethodPost:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusForbidden)
			w.Write([]byte(`{"errors":[{"code":"DENIED","message":"requested access to the resource is denied"}]}`))
		}
	}))
	t.Cleanup(denying.Close)
	wanting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
		w.WriteHeader(http.StatusUnauthorized)
	}))
	t.Cleanup(wanting.Close)
	host := func(s *httptest.Server) string { return strings.TrimPrefix(s.URL, "http://") }

	c := testClient(t, WithBasicAuth("tenant", "pw"))
	repo, _ := name.NewRepository(host(denying) + "/acme/x")
	status := func(err error) int {
		var terr *transport.Error
		if errors.As(err, &terr) {
			return terr.StatusCode
		}
		return 0
	}
	if err := c.CheckAccess(t.Context(), repo.Registry, repo.RepositoryStr()); status(err) != http.StatusForbidden || !strings.Contains(err.Error(), repo.String()) {
		t.Errorf("denied: %v", err)
	}
	repo, _ = name.NewRepository(host(wanting) + "/acme/x")
	if err := testClient(t, withKeychain(authn.NewMultiKeychain())).CheckAccess(t.Context(), repo.Registry, repo.RepositoryStr()); status(err) != http.StatusUnauthorized {
		t.Errorf("anonymous: %v", err)
	}

	open := disktest.Registry(t)
	observed := testClient(t, WithRequestObserver(func(method, path string, status int) {
		if method == http.MethodDelete && strings.Contains(path, "/blobs/uploads/") {
			deleted.Add(1)
		}
	}))
	repo, _ = name.NewRepository(open + "/acme/x")
	if err := observed.CheckAccess(t.Context(), repo.Registry, repo.RepositoryStr()); err != nil {
		t.Errorf("open registry: %v", err)
	}
	if deleted.Load() != 1 {
		t.Errorf("%d upload sessions deleted, want 1", deleted.Load())
	}
}
