package registry

import (
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// countingServer serves dir over HTTP and counts the requests and body
// bytes it serves.
type countingServer struct {
	URL             string
	requests, bytes atomic.Int64
}

func serveCounting(t *testing.T, dir string) *countingServer {
	t.Helper()
	c := &countingServer{}
	files := http.FileServer(http.Dir(dir))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.requests.Add(1)
		files.ServeHTTP(countingWriter{w, &c.bytes}, r)
	}))
	t.Cleanup(srv.Close)
	c.URL = srv.URL
	return c
}

type countingWriter struct {
	http.ResponseWriter
	n *atomic.Int64
}

func (w countingWriter) Write(b []byte) (int, error) {
	n, err := w.ResponseWriter.Write(b)
	w.n.Add(int64(n))
	return n, err
}

// TestImportChecksTheRegistryBeforeTheSource imports from an HTTP server
// that counts what it serves: with a wrong password, without credentials
// and with an unreachable registry, the import fails naming the cause
// before a single byte of the source is served; with the right password
// it reads the source and pushes.
func TestImportChecksTheRegistryBeforeTheSource(t *testing.T) {
	testenv.RequireQEMU(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{Username: "tenant", Password: "s3cret"})
	dir := t.TempDir()
	qcow := makeDisk(t, dir, 16, 2, "qcow2")
	src := serveCounting(t, dir)
	url := src.URL + "/" + filepath.Base(qcow)

	// A port nothing listens on.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()

	noConfig := t.TempDir() // an empty docker config: no stored credentials
	for _, tc := range []struct {
		name, ref, stdin string
		args             []string
		says             string
	}{
		{"wrong password", reg.Host + "/acme/early:1", "wrong\n", []string{"--username", "tenant", "--password-stdin"},
			`wrong credentials for ` + reg.Host + `: the registry refused user "tenant"`},
		{"no credentials", reg.Host + "/acme/early:1", "", nil,
			"registry " + reg.Host + " wants credentials"},
		{"unreachable", closed + "/acme/early:1", "", nil,
			"registry " + closed + " unreachable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := src.requests.Load()
			r := testenv.RunCommand(t, testenv.Command{
				Name:  testenv.Imagectl,
				Args:  append([]string{"import", "--quiet", url, tc.ref}, tc.args...),
				Env:   []string{"IMAGEPIPE_CACHE=" + t.TempDir(), "DOCKER_CONFIG=" + noConfig},
				Stdin: tc.stdin,
			})
			t.Logf("%s", r.Stderr)
			if r.Code != 1 || !strings.Contains(r.Stderr, tc.says) {
				t.Errorf("exit %d, stderr %q; want 1 and %q", r.Code, r.Stderr, tc.says)
			}
			if n := src.requests.Load() - before; n != 0 {
				t.Errorf("the source server got %d requests (%d bytes served) before the registry was checked", n, src.bytes.Load())
			}
		})
	}
	if tags := reg.Tags(t, "acme/early"); len(tags) != 0 {
		t.Errorf("tags after failed imports: %v", tags)
	}

	r := testenv.RunCommand(t, testenv.Command{
		Name:  testenv.Imagectl,
		Args:  []string{"import", "--quiet", url, reg.Host + "/acme/early:1", "--username", "tenant", "--password-stdin"},
		Env:   []string{"IMAGEPIPE_CACHE=" + t.TempDir(), "DOCKER_CONFIG=" + noConfig},
		Stdin: "s3cret\n",
	})
	if r.Code != 0 {
		t.Fatalf("import with the right password: exit %d: %s", r.Code, r.Stderr)
	}
	if got := src.bytes.Load(); got < fileSize(t, qcow) {
		t.Errorf("the source server served %d bytes of %d", got, fileSize(t, qcow))
	}
}
