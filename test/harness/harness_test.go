package harness_test

import (
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/validate"
	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/imagepipe/imagepipe/test/harness"
)

func TestRegistryPlainSurvivesKillAndRestart(t *testing.T) {
	reg := harness.StartRegistry(t, harness.RegistryOptions{})
	tr := transport(t, "")
	if code := getV2(t, tr, "http://"+reg.Host, nil); code != http.StatusOK {
		t.Fatalf("GET /v2/ = %d, want 200", code)
	}

	ref := reg.Host + "/harness/random:v1"
	want := pushRandom(t, ref, remote.WithTransport(tr))
	pullAndCheck(t, ref, want, remote.WithTransport(tr))

	reg.Kill(t)
	if _, err := (&http.Client{Transport: tr}).Get("http://" + reg.Host + "/v2/"); err == nil {
		t.Fatal("registry still answers after Kill")
	}
	reg.Restart(t)
	pullAndCheck(t, ref, want, remote.WithTransport(tr))
	if _, err := os.Stat(filepath.Join(reg.RootDir, "docker", "registry", "v2", "repositories", "harness", "random")); err != nil {
		t.Errorf("repository not under RootDir: %v", err)
	}
}

func TestRegistryAuthTLS(t *testing.T) {
	reg := harness.StartRegistry(t, harness.RegistryOptions{Username: "alice", Password: "wonderland", TLS: true})
	if reg.CAFile == "" {
		t.Fatal("CAFile is empty for a TLS registry")
	}
	tr := transport(t, reg.CAFile)
	base := "https://" + reg.Host

	if code := getV2(t, tr, base, nil); code != http.StatusUnauthorized {
		t.Errorf("GET /v2/ without credentials = %d, want 401", code)
	}
	if code := getV2(t, tr, base, &authn.Basic{Username: "alice", Password: "wrong"}); code != http.StatusUnauthorized {
		t.Errorf("GET /v2/ with a wrong password = %d, want 401", code)
	}
	if code := getV2(t, tr, base, &authn.Basic{Username: "alice", Password: "wonderland"}); code != http.StatusOK {
		t.Errorf("GET /v2/ with credentials = %d, want 200", code)
	}

	ref := reg.Host + "/harness/secure:v1"
	img, err := random.Image(4096, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(mustRef(t, ref), img, remote.WithTransport(tr)); err == nil {
		t.Error("anonymous push succeeded on a registry with auth")
	}
	auth := remote.WithAuth(&authn.Basic{Username: "alice", Password: "wonderland"})
	want := pushRandom(t, ref, remote.WithTransport(tr), auth)
	pullAndCheck(t, ref, want, remote.WithTransport(tr), auth)
}

func TestRegistryNotifiesPushes(t *testing.T) {
	type envelope struct {
		Events []struct {
			Action string `json:"action"`
			Target struct {
				Repository string `json:"repository"`
				Digest     string `json:"digest"`
				Tag        string `json:"tag"`
			} `json:"target"`
		} `json:"events"`
	}
	received := make(chan envelope, 100)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer hook-token" {
			t.Errorf("notification Authorization = %q", r.Header.Get("Authorization"))
		}
		var env envelope
		if err := json.NewDecoder(r.Body).Decode(&env); err != nil {
			t.Errorf("decoding notification: %v", err)
		}
		select {
		case received <- env:
		default:
		}
	}))
	t.Cleanup(hook.Close)

	reg := harness.StartRegistry(t, harness.RegistryOptions{NotifyURL: hook.URL, NotifyToken: "hook-token"})
	tr := transport(t, "")
	want := pushRandom(t, reg.Host+"/harness/notified:v1", remote.WithTransport(tr))

	timeout := time.After(30 * time.Second)
	for {
		select {
		case env := <-received:
			for _, e := range env.Events {
				if e.Action == "push" && e.Target.Repository == "harness/notified" && e.Target.Digest == want.String() {
					return
				}
			}
		case <-timeout:
			t.Fatalf("no push event for harness/notified@%s within 30 s", want)
		}
	}
}

func TestMinIOPutFile(t *testing.T) {
	m := harness.StartMinIO(t)
	data := randomBytes(t, 1<<20)
	path := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	m.PutFile(t, "images", "fedora/disk.img", path)
	m.PutFile(t, "images", "fedora/again.img", path) // the bucket exists now

	tr, err := minio.DefaultTransport(false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tr.CloseIdleConnections)
	client, err := minio.New(m.Endpoint, &minio.Options{
		Creds:     credentials.NewStaticV4(m.AccessKey, m.SecretKey, ""),
		Transport: tr,
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"fedora/disk.img", "fedora/again.img"} {
		obj, err := client.GetObject(t.Context(), "images", key, minio.GetObjectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(obj)
		obj.Close()
		if err != nil {
			t.Fatalf("reading %s back: %v", key, err)
		}
		if !bytes.Equal(got, data) {
			t.Errorf("%s: read back %d bytes that differ from the %d uploaded", key, len(got), len(data))
		}
	}
}

func TestCutProxyCutsAtOffset(t *testing.T) {
	echo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Read all before answering: an HTTP/1 handler that writes first cannot read on.
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		_, _ = w.Write(body)
	}))
	t.Cleanup(echo.Close)
	const cut = 100000
	proxy := harness.StartCutProxy(t, echo.Listener.Addr().String(), cut)
	client := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(client.CloseIdleConnections)
	url := "http://" + proxy.Addr + "/echo"

	small := randomBytes(t, 1000)
	if got, err := post(client, url, small); err != nil || !bytes.Equal(got, small) {
		t.Fatalf("small request before the cut offset: err %v, echoed %d of %d bytes", err, len(got), len(small))
	}
	if proxy.Cuts() != 0 {
		t.Fatalf("Cuts() = %d before the offset, want 0", proxy.Cuts())
	}

	if _, err := post(client, url, randomBytes(t, 1<<20)); err == nil {
		t.Fatal("1 MiB request through a proxy cutting at 100000 succeeded")
	}
	if got := proxy.Forwarded(); got != cut {
		t.Errorf("Forwarded() = %d, want exactly %d", got, cut)
	}
	if proxy.Cuts() != 1 {
		t.Errorf("Cuts() = %d, want 1", proxy.Cuts())
	}

	// Past its last offset the proxy forwards everything.
	if got, err := post(client, url, small); err != nil || !bytes.Equal(got, small) {
		t.Fatalf("request after the cut: err %v, echoed %d of %d bytes", err, len(got), len(small))
	}
	if got := proxy.Forwarded(); got <= cut+int64(len(small)) {
		t.Errorf("Forwarded() = %d after another request, want more than %d", got, cut+len(small))
	}
}

// transport returns an HTTP transport trusting caFile (if not empty), closed when the test ends.
func transport(t *testing.T, caFile string) *http.Transport {
	t.Helper()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			t.Fatal(err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			t.Fatalf("no certificate in %s", caFile)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool}
	}
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}

// getV2 returns the status of GET base/v2/, with basic auth when auth is not nil.
func getV2(t *testing.T, tr http.RoundTripper, base string, auth *authn.Basic) int {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, base+"/v2/", nil)
	if err != nil {
		t.Fatal(err)
	}
	if auth != nil {
		req.SetBasicAuth(auth.Username, auth.Password)
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("GET %s/v2/: %v", base, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// pushRandom pushes a small random image to ref and returns its digest.
func pushRandom(t *testing.T, ref string, opts ...remote.Option) v1.Hash {
	t.Helper()
	img, err := random.Image(4096, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(mustRef(t, ref), img, append(opts, remote.WithContext(t.Context()))...); err != nil {
		t.Fatalf("pushing %s: %v", ref, err)
	}
	digest, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return digest
}

// pullAndCheck reads ref back, checks its digest and verifies every blob against its digest.
func pullAndCheck(t *testing.T, ref string, want v1.Hash, opts ...remote.Option) {
	t.Helper()
	img, err := remote.Image(mustRef(t, ref), append(opts, remote.WithContext(t.Context()))...)
	if err != nil {
		t.Fatalf("pulling %s: %v", ref, err)
	}
	got, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Errorf("%s has digest %s, want %s", ref, got, want)
	}
	if err := validate.Image(img); err != nil {
		t.Errorf("validating %s: %v", ref, err)
	}
}

func mustRef(t *testing.T, ref string) name.Reference {
	t.Helper()
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func randomBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// post sends body to url and returns the response body; an error in either direction counts.
func post(client *http.Client, url string, body []byte) ([]byte, error) {
	resp, err := client.Post(url, "application/octet-stream", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}
