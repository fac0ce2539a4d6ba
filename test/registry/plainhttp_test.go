package registry

import (
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/imagepipe/imagepipe/internal/need"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// privateAddr is where TestNoCredentialsInClearToAPrivateAddress's
// registry listens, in a network namespace of its own: a private address,
// to which go-containerregistry would fall back to plain HTTP.
const privateAddr = "10.55.0.1:5000"

// publicAddr is where TestNoPlainHTTPToAPublicAddress's registry listens:
// an address of TEST-NET-3 (RFC 5737), neither loopback nor private, as a
// registry on the internet has.
const publicAddr = "203.0.113.7:5000"

// TestNoCredentialsInClearToAPrivateAddress: imagectl list against a
// registry on a private address that speaks only HTTP sends it no
// credential unless --insecure is given, and says why. The listener and
// imagectl run in a network namespace where 10.55.0.1 is on lo; the
// listener is this test binary (TestPlainHTTPListener), which logs the
// Authorization header of every request and answers with a Basic challenge.
func TestNoCredentialsInClearToAPrivateAddress(t *testing.T) {
	r, log := listPlainHTTPRegistry(t, privateAddr, false)
	if r.Code == 0 || !strings.Contains(r.Stderr, "refusing plain HTTP to "+privateAddr) || !strings.Contains(r.Stderr, "--insecure") {
		t.Errorf("imagectl list over plain HTTP to %s: exit %d, want refused naming --insecure\n%s", privateAddr, r.Code, r.Stderr)
	}
	if strings.Contains(log, "Basic ") {
		t.Errorf("the registry received the credential in clear:\n%s", log)
	}

	// With --insecure the credential goes, in plain HTTP: the listener
	// does see one when it is sent.
	r, log = listPlainHTTPRegistry(t, privateAddr, true)
	if r.Code == 0 || !strings.Contains(log, "Basic ") {
		t.Errorf("with --insecure: exit %d, requests %q; want the credential sent and refused\n%s", r.Code, log, r.Stderr)
	}
}

// TestNoPlainHTTPToAPublicAddress: imagectl list against a registry on a
// public address that speaks only HTTP tries HTTPS alone, never falls back
// to plain HTTP (no request reaches the listener, with or without a
// credential), and says that the registry speaks plain HTTP, naming
// --insecure; with --insecure it speaks plain HTTP to it. The listener
// and imagectl run in a network namespace where 203.0.113.7 is on lo
// (see TestNoCredentialsInClearToAPrivateAddress).
func TestNoPlainHTTPToAPublicAddress(t *testing.T) {
	r, log := listPlainHTTPRegistry(t, publicAddr, false)
	if r.Code == 0 || !strings.Contains(r.Stderr, "registry "+publicAddr+" speaks plain HTTP, not HTTPS") || !strings.Contains(r.Stderr, "--insecure") {
		t.Errorf("imagectl list of a plain HTTP registry at %s: exit %d, want HTTPS only, naming --insecure\n%s", publicAddr, r.Code, r.Stderr)
	}
	if log != "" {
		t.Errorf("plain HTTP requests reached the registry at %s:\n%s", publicAddr, log)
	}

	r, log = listPlainHTTPRegistry(t, publicAddr, true)
	if r.Code == 0 || !strings.Contains(log, "GET /v2/") || !strings.Contains(log, "Basic ") {
		t.Errorf("with --insecure: exit %d, requests %q; want plain HTTP, the credential sent and refused\n%s", r.Code, log, r.Stderr)
	}
}

// listPlainHTTPRegistry runs imagectl list ADDR/acme, with a credential
// and --insecure when asked, against TestPlainHTTPListener on addr, both
// in a network namespace of their own where addr's IP is on lo. It
// returns imagectl's result and the requests the listener logged.
func listPlainHTTPRegistry(t *testing.T, addr string, insecure bool) (testenv.Result, string) {
	t.Helper()
	need.Root(t, "the test makes a network namespace with an address of its own")
	need.Program(t, "unshare")
	need.Program(t, "ip")
	ip, _, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	log := filepath.Join(t.TempDir(), "requests.log")
	flags := "--username tenant --password-stdin"
	if insecure {
		flags += " --insecure"
	}
	script := `set -e
ip link set lo up
ip addr add ` + ip + `/32 dev lo
IMAGEPIPE_PLAINHTTP_LOG="$1" IMAGEPIPE_PLAINHTTP_ADDR="$4" "$2" -test.run '^TestPlainHTTPListener$' &
until [ -e "$1.ready" ]; do sleep 0.05; done
set +e
"$3" list "$4/acme" ` + flags + `
code=$?
kill $!
exit $code`
	r := testenv.RunCommand(t, testenv.Command{
		Name:  "unshare",
		Args:  []string{"-n", "sh", "-c", script, "sh", log, os.Args[0], testenv.Imagectl, addr},
		Env:   []string{"IMAGEPIPE_CACHE=" + t.TempDir()},
		Stdin: "s3cret\n",
	})
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatalf("the listener wrote no log (%v); imagectl: exit %d\n%s", err, r.Code, r.Stderr)
	}
	return r, string(b)
}

// TestPlainHTTPListener is the registry of listPlainHTTPRegistry, run by
// it as a child process in its network namespace, listening on
// $IMAGEPIPE_PLAINHTTP_ADDR; it does nothing otherwise.
func TestPlainHTTPListener(t *testing.T) {
	logPath := os.Getenv("IMAGEPIPE_PLAINHTTP_LOG")
	if logPath == "" {
		return
	}
	log, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", os.Getenv("IMAGEPIPE_PLAINHTTP_ADDR"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(logPath+".ready", nil, 0o600); err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		log.WriteString(r.Method + " " + r.URL.Path + " Authorization=" + r.Header.Get("Authorization") + "\n")
		w.Header().Set("WWW-Authenticate", `Basic realm="registry"`)
		w.WriteHeader(http.StatusUnauthorized)
	})}
	srv.Serve(ln) // until the parent's script kills this process
}
