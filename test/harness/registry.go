package harness

import (
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"golang.org/x/crypto/bcrypt"
)

// RegistryOptions configures StartRegistry. The zero value is a plain-HTTP registry without auth.
type RegistryOptions struct {
	Username, Password string // non-empty: htpasswd auth (bcrypt, golang.org/x/crypto/bcrypt)
	TLS                bool   // serve HTTPS with a self-signed CA made in Go (crypto/x509), cert valid for 127.0.0.1 and localhost
	NotifyURL          string // optional: notifications endpoint (distribution's notifications.endpoints), with header Authorization: Bearer NotifyToken
	NotifyToken        string
	// NotifyURLs are further endpoints notified the same way, e.g. one syncer per hub.
	NotifyURLs []string
	// AllowLayerURLs lets manifests name urls on their layers
	// (validation.manifests.urls.allow), which distribution refuses by
	// default and some providers allow.
	AllowLayerURLs bool
	// Gate, when set, is the image-gate binary to run beside the registry
	// (Registry.Gate): notified like the endpoints above and polling, with
	// the registry's credential and CA and the process's provider key.
	// Syncers import nothing without it.
	Gate string
	// GateArgs add to or override the gate's flags (Gate.Start).
	GateArgs []string
}

// Registry is a running CNCF distribution registry (cmd/registry, v3) with filesystem storage
// and deletes enabled.
type Registry struct {
	Host    string // "127.0.0.1:PORT"
	CAFile  string // PEM of the CA when TLS, else ""
	RootDir string // storage root (filesystem driver), survives Restart
	// Gate is the image-gate started with RegistryOptions.Gate, else nil.
	Gate *Gate

	bin, dir, logPath string
	opts              RegistryOptions
	probe             *http.Client // answers readiness probes; keeps no idle connections
	proc              *proc
}

// StartRegistry starts a registry on a free port of 127.0.0.1 with its config in t.TempDir(),
// waits until GET /v2/ answers (200, or 401 with auth), and stops it when the test ends. It skips
// the test when the registry binary is not built.
func StartRegistry(t T, opts RegistryOptions) *Registry {
	t.Helper()
	r := &Registry{bin: Binary(t, "registry"), dir: t.TempDir(), opts: opts}
	r.RootDir = filepath.Join(r.dir, "storage")
	r.logPath = filepath.Join(r.dir, "registry.log")
	t.Cleanup(func() {
		if r.proc != nil {
			if err := r.proc.stop(); err != nil {
				t.Errorf("stopping registry: %v", err)
			}
		}
		logOnFailure(t, "registry", r.logPath)
	})

	transport := &http.Transport{DisableKeepAlives: true}
	if opts.TLS {
		certs, err := writeCerts(r.dir)
		if err != nil {
			t.Fatalf("making registry certificates: %v", err)
		}
		r.CAFile = certs.CA
		pool, err := certPool(certs.CA)
		if err != nil {
			t.Fatal(err)
		}
		transport.TLSClientConfig = &tls.Config{RootCAs: pool}
	}
	r.probe = &http.Client{Transport: transport}
	if opts.Username != "" {
		if err := writeHtpasswd(filepath.Join(r.dir, "htpasswd"), opts.Username, opts.Password); err != nil {
			t.Fatal(err)
		}
	}

	if opts.Gate != "" {
		r.Gate = ReserveGate(t)
		r.opts.NotifyURLs = append(append([]string(nil), opts.NotifyURLs...), r.Gate.WebhookURL)
		r.opts.NotifyToken = SyncerWebhookToken
	}

	var err error
	for range startAttempts {
		r.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t)))
		if err = r.start(); !errors.Is(err, errExited) {
			break
		}
	}
	if err != nil {
		t.Fatalf("starting registry: %v", err)
	}
	if r.Gate != nil {
		r.Gate.Start(t, opts.Gate, r.Host, r.CAFile, opts.Username, opts.Password, opts.GateArgs...)
	}
	return r
}

// Kill sends the registry SIGKILL now, for tests of a registry that dies mid-operation.
func (r *Registry) Kill(t T) {
	t.Helper()
	if err := r.proc.kill(); err != nil {
		t.Fatalf("killing registry: %v", err)
	}
}

// Restart starts the registry again on the same port and storage, stopping it first if it is
// still running, and waits until it answers.
func (r *Registry) Restart(t T) {
	t.Helper()
	if err := r.proc.stop(); err != nil {
		t.Fatalf("stopping registry: %v", err)
	}
	var err error
	for range startAttempts { // the old process's port may be taken for a moment
		if err = r.start(); !errors.Is(err, errExited) {
			break
		}
	}
	if err != nil {
		t.Fatalf("restarting registry: %v", err)
	}
}

// LogPath is the file holding the registry's stdout and stderr, across restarts.
func (r *Registry) LogPath() string { return r.logPath }

// Tags lists repo's tags with the registry's credentials and CA. A
// repository the registry does not know has none; any other failure (a
// 401, a registry that is down) fails the test, so that "no tags" is never
// an error in disguise.
func (r *Registry) Tags(t T, repo string) []string {
	t.Helper()
	ref, err := name.NewRepository(r.Host + "/" + repo)
	if err != nil {
		t.Fatal(err)
	}
	opts := []remote.Option{remote.WithTransport(r.probe.Transport), remote.WithContext(t.Context())}
	if r.opts.Username != "" {
		opts = append(opts, remote.WithAuth(&authn.Basic{Username: r.opts.Username, Password: r.opts.Password}))
	}
	tags, err := remote.List(ref, opts...)
	var terr *transport.Error
	if errors.As(err, &terr) && terr.StatusCode == http.StatusNotFound {
		return nil
	}
	if err != nil {
		t.Fatalf("listing the tags of %s: %v", ref, err)
	}
	return tags
}

// start writes the config for r.Host and runs the registry until it answers /v2/.
func (r *Registry) start() error {
	config := filepath.Join(r.dir, "config.yml")
	if err := os.WriteFile(config, r.config(), 0o600); err != nil {
		return fmt.Errorf("writing config: %w", err)
	}
	// No tracing exporter: the default one would try to reach a collector on localhost.
	p, err := startProc(r.logPath, []string{"OTEL_TRACES_EXPORTER=none"}, r.bin, "serve", config)
	if err != nil {
		return err
	}
	r.proc = p
	scheme := "http"
	if r.opts.TLS {
		scheme = "https"
	}
	url := scheme + "://" + r.Host + "/v2/"
	err = waitReady(p, httpAnswers(r.probe, url, nil, http.StatusOK, http.StatusUnauthorized))
	if err != nil {
		_ = p.stop()
		return err
	}
	return nil
}

// config renders the registry's configuration. JSON is YAML, and encoding/json quotes every
// path and secret correctly.
func (r *Registry) config() []byte {
	httpConf := map[string]any{
		"addr":   r.Host,
		"secret": randomHex(16), // signs upload state; a restart drops uploads in flight anyway
	}
	if r.opts.TLS {
		httpConf["tls"] = map[string]any{
			"certificate": filepath.Join(r.dir, "server.pem"),
			"key":         filepath.Join(r.dir, "server-key.pem"),
		}
	}
	conf := map[string]any{
		"version": "0.1",
		"log":     map[string]any{"level": "info", "formatter": "text"},
		"storage": map[string]any{
			"filesystem": map[string]any{"rootdirectory": r.RootDir},
			"delete":     map[string]any{"enabled": true},
		},
		"http": httpConf,
	}
	if r.opts.AllowLayerURLs {
		conf["validation"] = map[string]any{"manifests": map[string]any{"urls": map[string]any{"allow": []string{"^https?://"}}}}
	}
	if r.opts.Username != "" {
		conf["auth"] = map[string]any{
			"htpasswd": map[string]any{"realm": "imagepipe-test", "path": filepath.Join(r.dir, "htpasswd")},
		}
	}
	var endpoints []any
	for i, url := range append([]string{r.opts.NotifyURL}, r.opts.NotifyURLs...) {
		if url == "" {
			continue
		}
		endpoint := map[string]any{
			"name":      fmt.Sprintf("imagepipe-test-%d", i),
			"url":       url,
			"timeout":   "5s",
			"threshold": 3,
			"backoff":   "1s",
		}
		if r.opts.NotifyToken != "" {
			endpoint["headers"] = map[string][]string{"Authorization": {"Bearer " + r.opts.NotifyToken}}
		}
		endpoints = append(endpoints, endpoint)
	}
	if len(endpoints) > 0 {
		conf["notifications"] = map[string]any{"endpoints": endpoints}
	}
	data, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		panic(err) // only maps, strings and ints: cannot fail
	}
	return data
}

// writeHtpasswd writes a one-user htpasswd file. bcrypt.MinCost keeps the registry's check of
// every request cheap; these are throwaway test credentials.
func writeHtpasswd(path, user, password string) error {
	hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
	if err != nil {
		return fmt.Errorf("hashing registry password: %w", err)
	}
	if err := os.WriteFile(path, []byte(user+":"+string(hash)+"\n"), 0o600); err != nil {
		return fmt.Errorf("writing htpasswd: %w", err)
	}
	return nil
}

// certPool reads a PEM CA file into a pool.
func certPool(caFile string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("reading CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("no certificate in %s", caFile)
	}
	return pool, nil
}

// randomHex returns n random bytes as hex.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return hex.EncodeToString(b)
}
