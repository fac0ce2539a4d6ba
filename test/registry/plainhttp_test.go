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

// TestNoCredentialsInClearToAPrivateAddress: imagectl list against a
// registry on a private address that speaks only HTTP sends it no
// credential unless --insecure is given, and says why. The listener and
// imagectl run in a network namespace where 10.55.0.1 is on lo; the
// listener is this test binary (TestPlainHTTPListener), which logs the
// Authorization header of every request and answers with a Basic challenge.
func TestNoCredentialsInClearToAPrivateAddress(t *testing.T) {
	need.Root(t, "the test makes a network namespace with a private address")
	need.Program(t, "unshare")
	need.Program(t, "ip")
	dir := t.TempDir()
	run := func(insecure bool) (testenv.Result, string) {
		log := filepath.Join(dir, "requests.log")
		os.Remove(log)
		os.Remove(log + ".ready")
		flags := "--username tenant --password-stdin"
		if insecure {
			flags += " --insecure"
		}
		script := `set -e
ip link set lo up
ip addr add 10.55.0.1/32 dev lo
IMAGEPIPE_PLAINHTTP_LOG="$1" "$2" -test.run '^TestPlainHTTPListener$' &
until [ -e "$1.ready" ]; do sleep 0.05; done
set +e
"$3" list ` + privateAddr + `/acme ` + flags + `
code=$?
kill $!
exit $code`
		r := testenv.RunCommand(t, testenv.Command{
			Name:  "unshare",
			Args:  []string{"-n", "sh", "-c", script, "sh", log, os.Args[0], testenv.Imagectl},
			Env:   []string{"IMAGEPIPE_CACHE=" + t.TempDir()},
			Stdin: "s3cret\n",
		})
		b, err := os.ReadFile(log)
		if err != nil {
			t.Fatalf("the listener wrote no log (%v); imagectl: exit %d\n%s", err, r.Code, r.Stderr)
		}
		return r, string(b)
	}

	r, log := run(false)
	if r.Code == 0 || !strings.Contains(r.Stderr, "refusing plain HTTP to "+privateAddr) || !strings.Contains(r.Stderr, "--insecure") {
		t.Errorf("imagectl list over plain HTTP to %s: exit %d, want refused naming --insecure\n%s", privateAddr, r.Code, r.Stderr)
	}
	if strings.Contains(log, "Basic ") {
		t.Errorf("the registry received the credential in clear:\n%s", log)
	}

	// With --insecure the credential goes, in plain HTTP: the listener
	// does see one when it is sent.
	r, log = run(true)
	if r.Code == 0 || !strings.Contains(log, "Basic ") {
		t.Errorf("with --insecure: exit %d, requests %q; want the credential sent and refused\n%s", r.Code, log, r.Stderr)
	}
}

// TestPlainHTTPListener is the registry of
// TestNoCredentialsInClearToAPrivateAddress, run by it as a child process
// in its network namespace; it does nothing otherwise.
func TestPlainHTTPListener(t *testing.T) {
	logPath := os.Getenv("IMAGEPIPE_PLAINHTTP_LOG")
	if logPath == "" {
		return
	}
	log, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", privateAddr)
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
