package source_test

import (
	"bytes"
	"crypto/x509"
	"errors"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/imagepipe/imagepipe/internal/source"
	"github.com/imagepipe/imagepipe/test/harness"
)

// TestOpenHTTPSPrivateCA: an https:// source whose certificate a private CA
// signs is refused as unknown, opened with CAFile naming that CA or with
// InsecureSkipVerify, and refused again with the CA of another server.
func TestOpenHTTPSPrivateCA(t *testing.T) {
	data := imageBytes(1<<20 + 5)
	srv := harness.StartHTTPS(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "disk", time.Unix(1e9, 0), bytes.NewReader(data))
	}))
	other := harness.StartHTTPS(t, http.NotFoundHandler())
	url := srv.URL + "/disk.raw"

	_, err := source.Open(t.Context(), url, source.Options{})
	var unknown x509.UnknownAuthorityError
	if !errors.As(err, &unknown) {
		t.Errorf("without CAFile: err = %v, want an x509.UnknownAuthorityError", err)
	}
	if _, err := source.Open(t.Context(), url, source.Options{CAFile: other.CAFile}); !errors.As(err, &unknown) {
		t.Errorf("with another server's CA: err = %v, want an x509.UnknownAuthorityError", err)
	}
	for name, opts := range map[string]source.Options{
		"CAFile":             {CAFile: srv.CAFile},
		"InsecureSkipVerify": {InsecureSkipVerify: true},
	} {
		t.Run(name, func(t *testing.T) {
			opts.Checksum = digestOf(data)
			img := mustOpen(t, url, opts)
			if got := readAll(t, img); !bytes.Equal(got, data) {
				t.Errorf("downloaded bytes differ from the original")
			}
		})
	}
}

// TestOpenTLSOptionErrors: a CA file that is missing or holds no
// certificate fails Open, and so do the TLS options with a caller's own
// HTTP client, whose TLS settings they would silently not reach.
func TestOpenTLSOptionErrors(t *testing.T) {
	dir := t.TempDir()
	local := writeFile(t, dir, "disk.raw", imageBytes(4096))
	notPEM := writeFile(t, dir, "ca.pem", []byte("not a certificate\n"))
	for name, tc := range map[string]struct {
		opts source.Options
		say  string
	}{
		"missing CA file": {source.Options{CAFile: filepath.Join(dir, "nope.pem")}, "reading the CA file"},
		"CA file not PEM": {source.Options{CAFile: notPEM}, "no PEM certificates in the CA file " + notPEM},
		"with HTTPClient": {source.Options{InsecureSkipVerify: true, HTTPClient: &http.Client{}}, "set them on Options.HTTPClient"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := source.Open(t.Context(), local, tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.say) {
				t.Errorf("err = %v, want one saying %q", err, tc.say)
			}
		})
	}
}
