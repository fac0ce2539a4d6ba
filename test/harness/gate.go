package harness

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
)

// providerKey is the provider's signing key of this test process: the gate
// signs its verdicts with it, and every syncer trusts it.
var providerKey = sync.OnceValue(func() *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(err)
	}
	return k
})

// ProviderKeyFiles writes the process's provider key pair into a folder of
// the test: the private key (PKCS#8 PEM), as image-gate's --signing-key
// reads it, and the public key, as image-syncer's --gate-keys and cosign's
// --key read it.
func ProviderKeyFiles(t T) (private, public string) {
	t.Helper()
	dir := t.TempDir()
	der, err := x509.MarshalPKCS8PrivateKey(providerKey())
	if err != nil {
		t.Fatal(err)
	}
	pub, err := x509.MarshalPKIXPublicKey(providerKey().Public())
	if err != nil {
		t.Fatal(err)
	}
	private, public = filepath.Join(dir, "gate.key"), filepath.Join(dir, "gate.pub")
	if err := os.WriteFile(private, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(public, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644); err != nil {
		t.Fatal(err)
	}
	return private, public
}

// Gate is one image-gate process beside a registry. ReserveGate picks its
// addresses first, so that the registry can notify it.
type Gate struct {
	// WebhookURL is where the registry's notifications go, with
	// SyncerWebhookToken as bearer token.
	WebhookURL string
	// MetricsURL is its Prometheus endpoint.
	MetricsURL string
	// HealthURL is the base of /healthz and /readyz.
	HealthURL string
	// LogPath holds its text logs, set by Start.
	LogPath string
	// Args are the arguments Start ran the binary with.
	Args []string

	proc    *proc
	stopped bool
}

// ReserveGate picks free ports on 127.0.0.1 for a gate's endpoints.
func ReserveGate(t T) *Gate {
	t.Helper()
	addr := func() string { return "127.0.0.1:" + strconv.Itoa(freePort(t)) }
	return &Gate{WebhookURL: "http://" + addr() + "/webhook", MetricsURL: "http://" + addr() + "/metrics", HealthURL: "http://" + addr()}
}

// Start runs the image-gate binary bin for the registry at host with the
// provider key (ProviderKeyFiles), the webhook (SyncerWebhookToken),
// polling every 2 s, text logs and a verification folder of the test;
// caFile and user/password, when set, are the registry's CA and
// credential. args add to or override these flags. It waits until
// /readyz answers and stops the gate when the test ends.
func (g *Gate) Start(t T, bin, host, caFile, user, password string, args ...string) {
	t.Helper()
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "webhook-token")
	if err := os.WriteFile(tokenFile, []byte(SyncerWebhookToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	key, _ := ProviderKeyFiles(t)
	hostPort := func(u string) string { return strings.SplitN(strings.TrimPrefix(u, "http://"), "/", 2)[0] }
	base := []string{
		"--registry", host,
		"--signing-key", key,
		"--webhook-listen", hostPort(g.WebhookURL),
		"--webhook-token-file", tokenFile,
		"--metrics-listen", hostPort(g.MetricsURL),
		"--health-listen", hostPort(g.HealthURL),
		"--poll-interval", "2s",
		"--temp-dir", dir,
		"--log-format", "text",
	}
	if caFile != "" {
		base = append(base, "--registry-ca-file", caFile)
	}
	if user != "" {
		cfg := filepath.Join(dir, "config.json")
		auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + password))
		data, _ := json.Marshal(map[string]any{"auths": map[string]any{host: map[string]string{"auth": auth}}})
		if err := os.WriteFile(cfg, data, 0o600); err != nil {
			t.Fatal(err)
		}
		base = append(base, "--docker-config", cfg)
	}
	g.Args = append(base, args...)
	g.LogPath = filepath.Join(dir, "image-gate.log")
	p, err := startProc(g.LogPath, nil, bin, g.Args...)
	if err != nil {
		t.Fatalf("image-gate: %v", err)
	}
	g.proc = p
	t.Cleanup(func() {
		g.Stop(t)
		logOnFailure(t, "image-gate", g.LogPath)
	})
	probe := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	if err := waitReady(p, httpAnswers(probe, g.HealthURL+"/readyz", nil, http.StatusOK)); err != nil {
		t.Fatalf("image-gate not ready: %v (log %s)", err, g.LogPath)
	}
}

// Pid is the gate's process ID.
func (g *Gate) Pid() int { return g.proc.cmd.Process.Pid }

// Stop ends the gate with SIGTERM and fails the test unless it exits
// cleanly within 30 s.
func (g *Gate) Stop(t T) {
	t.Helper()
	if g.proc == nil || g.stopped {
		return
	}
	g.stopped = true
	stopDaemon(t, g.proc, "image-gate", g.LogPath)
}

// Kill sends the gate SIGKILL now, and nothing to its children, for tests
// of a gate that dies mid-verification; it waits until the gate is reaped.
func (g *Gate) Kill(t T) {
	t.Helper()
	g.stopped = true
	if err := g.proc.kill(); err != nil {
		t.Fatalf("killing image-gate: %v", err)
	}
}
