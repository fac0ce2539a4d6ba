package source_test

import (
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/imagepipe/imagepipe/internal/source"
	"github.com/imagepipe/imagepipe/test/harness"
)

// The credentials the redaction tests put into URLs; no error may show them.
const (
	urlPassword  = "pw-Zq81kT"
	urlSignature = "sig-Kv27mW"
)

// refusedAddr is a 127.0.0.1 address that nothing listens on.
func refusedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// assertRedacted fails unless err is an error that names host and says
// say, without the password or signature of the URL it came from.
func assertRedacted(t *testing.T, err error, host, say string) {
	t.Helper()
	if err == nil {
		t.Fatal("Open succeeded")
	}
	msg := err.Error()
	for _, secret := range []string{urlPassword, urlSignature} {
		if strings.Contains(msg, secret) {
			t.Errorf("error shows the secret %q: %s", secret, msg)
		}
	}
	if !strings.Contains(msg, host) {
		t.Errorf("error does not name the host %s: %s", host, msg)
	}
	if !strings.Contains(msg, say) {
		t.Errorf("error does not say %q: %s", say, msg)
	}
}

// TestOpenHTTPErrorsRedacted: however an http(s) source with a password
// and a presigned query fails, the error names its host but shows neither
// the password nor the signature, nor the signature of a URL the server
// redirected to.
func TestOpenHTTPErrorsRedacted(t *testing.T) {
	source.SetResumeBackoff(t, time.Millisecond)
	refused := refusedAddr(t)
	data := imageBytes(256 << 10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/404":
			http.NotFound(w, r)
		case "/401":
			w.Header().Set("WWW-Authenticate", `Basic realm="images"`)
			http.Error(w, "wrong password", http.StatusUnauthorized)
		case "/500":
			http.Error(w, "broken", http.StatusInternalServerError)
		case "/redirect":
			// A presigned URL of a server that is down.
			http.Redirect(w, r, "http://"+refused+"/disk?X-Amz-Signature="+urlSignature, http.StatusFound)
		case "/loop":
			http.Redirect(w, r, r.URL.RequestURI(), http.StatusFound)
		case "/cut":
			if r.Header.Get("Range") != "" {
				// Every resume dies before the response.
				panic(http.ErrAbortHandler)
			}
			w.Header().Set("ETag", `"v1"`)
			w.Header().Set("Accept-Ranges", "bytes")
			w.Header().Set("Content-Length", strconv.Itoa(len(data)))
			w.WriteHeader(http.StatusOK)
			w.Write(data[:len(data)/2])
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	tlsSrv := harness.StartHTTPS(t, http.NotFoundHandler())

	for _, tc := range []struct {
		name, base, path, say string
	}{
		{"connection refused", "http://" + refused, "/disk", "connection refused"},
		{"404", srv.URL, "/404", "404 Not Found"},
		{"401", srv.URL, "/401", "401 Unauthorized"},
		{"500", srv.URL, "/500", "500 Internal Server Error"},
		{"unknown CA", tlsSrv.URL, "/disk", "certificate signed by unknown authority"},
		{"redirect to a refused URL", srv.URL, "/redirect", "connection refused"},
		{"redirect loop", srv.URL, "/loop", "redirects"},
		{"resume fails", srv.URL, "/cut", "giving up after 3 resumes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u, err := url.Parse(tc.base)
			if err != nil {
				t.Fatal(err)
			}
			u.User = url.UserPassword("alice", urlPassword)
			u.Path = tc.path
			u.RawQuery = "X-Amz-Signature=" + urlSignature
			tmp := t.TempDir()
			_, err = source.Open(t.Context(), u.String(), source.Options{TempDir: tmp})
			assertRedacted(t, err, u.Host, tc.say)
			assertEmpty(t, tmp)
		})
	}
}

// TestOpenS3ErrorsRedacted: credentials written into an s3:// URL or into
// the S3 endpoint URL, whether given in S3Options or AWS_ENDPOINT_URL,
// never show in the error that refuses them.
func TestOpenS3ErrorsRedacted(t *testing.T) {
	refused := refusedAddr(t)
	creds := "AKIDEXAMPLE:" + urlPassword + "@"
	for _, tc := range []struct {
		name, spec, endpoint, env string
		host, say                 string
	}{
		{
			name: "credentials in the s3 URL", spec: "s3://" + creds + "images/disk.raw", endpoint: "http://" + refused,
			host: "images/disk.raw", say: "s3://",
		},
		{
			name: "credentials in the endpoint", spec: "s3://images/disk.raw", endpoint: "http://" + creds + refused,
			host: refused, say: "S3 endpoint",
		},
		{
			name: "credentials in AWS_ENDPOINT_URL", spec: "s3://images/disk.raw", env: "http://" + creds + refused,
			host: refused, say: "S3 endpoint",
		},
		{
			name: "credentials in an endpoint of another scheme", spec: "s3://images/disk.raw", endpoint: "ftp://" + creds + refused,
			host: refused, say: "S3 endpoint",
		},
		{
			// A password with a bare % does not parse as a URL at all.
			name: "credentials in an endpoint that does not parse", spec: "s3://images/disk.raw", endpoint: "http://AKIDEXAMPLE:" + urlPassword + "%zz@" + refused,
			host: "http://", say: "S3 endpoint",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("AWS_ENDPOINT_URL_S3", "")
			t.Setenv("AWS_ENDPOINT_URL", tc.env)
			s3 := source.S3Options{Endpoint: tc.endpoint, AccessKey: "AKIDEXAMPLE", SecretKey: "not-the-password", Region: "us-east-1"}
			_, err := source.Open(t.Context(), tc.spec, source.Options{S3: s3})
			assertRedacted(t, err, tc.host, tc.say)
		})
	}
}
