package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestReportsNameTheSourceWithoutItsSecrets: the report inspect prints, and
// the one import prints for a rejected source under -o json, name an HTTP
// source without its password or presigned query.
func TestReportsNameTheSourceWithoutItsSecrets(t *testing.T) {
	raw := make([]byte, 1<<20)
	backing := append([]byte("QFI\xfb\x00\x00\x00\x03"), make([]byte, 1<<16)...) // a qcow2 header with no size: rejected
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/good.raw":
			w.Write(raw)
		case "/bad.gz":
			w.Write([]byte("\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xffnot deflate at all"))
		default:
			w.Write(backing)
		}
	}))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	reg := startRegistry(t)
	t.Setenv("IMAGEPIPE_CACHE", t.TempDir())
	for _, tc := range []struct {
		path string
		code int
		args []string
	}{
		{"/good.raw", 0, []string{"inspect", "-o", "json"}},
		{"/bad.qcow2", 3, []string{"inspect", "-o", "json"}},
		{"/bad.gz", 3, []string{"import", "-o", "json"}}, // refused by the source, reported by import
	} {
		path, code := tc.path, tc.code
		spec := "http://alice:pw-Zq81kT@" + host + path + "?X-Amz-Signature=sig-Kv27mW"
		args := append(tc.args, spec)
		if tc.args[0] == "import" {
			args = append(args, reg+"/acme/disk:1")
		}
		r := runReported(t, args...)
		if r.code != code || !strings.Contains(r.stdout, `"source"`) || !strings.Contains(r.stdout, host+path) {
			t.Errorf("%s %s: exit %d, want %d and a report naming the source:\n%s", tc.args[0], path, r.code, code, r.stdout)
		}
		if strings.Contains(r.stdout, "pw-Zq81kT") || strings.Contains(r.stdout, "sig-Kv27mW") {
			t.Errorf("%s %s: the report shows a secret:\n%s", tc.args[0], path, r.stdout)
		}
	}
}
