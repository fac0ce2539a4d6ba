package main

import (
	"encoding/base64"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/imagepipe/imagepipe/internal/imageref"
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

// TestDeniedPushIsExplained: a push the registry answers with 403 DENIED,
// when the upload starts or at the manifest, is explained as a denial
// (errDenied, which imagectl reports with code "denied") that names the
// user and the repository or reference refused.
func TestDeniedPushIsExplained(t *testing.T) {
	inner := ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Path
		if (r.Method == http.MethodPost && strings.HasPrefix(p, "/v2/acme/locked/")) || (r.Method == http.MethodPut && strings.HasPrefix(p, "/v2/acme/sealed/manifests/")) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusForbidden)
			io.WriteString(w, `{"errors":[{"code":"DENIED","message":"requested access to the resource is denied"}]}`)
			return
		}
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	c := testClient(t, registry.WithBasicAuth("tenant", "pw"))
	flags := &registryFlags{basicUser: "tenant"} // the flags c was built from
	img, err := random.Image(512, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ ref, says string }{
		{"/acme/locked:v1", "/acme/locked"},
		{"/acme/sealed:v1", "/acme/sealed:v1"},
	} {
		r, err := imageref.Parse(host+tc.ref, imageref.FormTag)
		if err != nil {
			t.Fatal(err)
		}
		ref, err := registry.Names{}.Reference(r)
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Push(t.Context(), ref, img)
		if err == nil {
			t.Fatalf("%s: the push succeeded", tc.ref)
		}
		explained := explain(flags.user, err, false)
		if !errors.Is(explained, errDenied) {
			t.Errorf("%v: not errDenied", explained)
		}
		if want := `access denied: user "tenant" may not push to ` + host + tc.says; !strings.Contains(explained.Error(), want) {
			t.Errorf("%q does not say %q", explained, want)
		}
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
	config := t.TempDir()
	t.Setenv("DOCKER_CONFIG", config)             // no credentials: anonymous
	tenant := &registryFlags{basicUser: "tenant"} // --username tenant
	anon := &registryFlags{tls: &tlsFlags{}}      // no --username: the keychain
	tests := []struct {
		f       *registryFlags
		msg     string
		want    []string
		notWant string
	}{
		{tenant, "storage quota exceeded for project acme\x1b[2J",
			[]string{`access denied: user "tenant" may not push to`, "(the registry says: storage quota exceeded for project acme [2J)"}, "\x1b"},
		{tenant, "requested access to the resource is denied",
			[]string{`access denied: user "tenant" may not push to`}, "registry says"},
		{anon, "", []string{"access denied: an anonymous user (no credentials for registry.example) may not push to"}, `user ""`},
	}
	for _, tc := range tests {
		got := explain(tc.f.user, denied(tc.msg), false)
		if !errors.Is(got, errDenied) {
			t.Errorf("%q: %v, not errDenied", tc.msg, got)
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

	// Without --username, the user is the one the keychain gives the
	// client: here the docker config's.
	auth := base64.StdEncoding.EncodeToString([]byte("keyed:pw"))
	if err := os.WriteFile(filepath.Join(config, "config.json"), []byte(`{"auths":{"registry.example":{"auth":"`+auth+`"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, want := explain(anon.user, denied(""), false), `access denied: user "keyed" may not push to`; !strings.Contains(got.Error(), want) {
		t.Errorf("%q does not say %q", got, want)
	}
}
