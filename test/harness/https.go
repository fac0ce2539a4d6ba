package harness

import (
	"crypto/tls"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
)

// HTTPSServer is an HTTPS server on 127.0.0.1 whose certificate a private,
// throwaway CA signs: clients reach it only by trusting CAFile (or by not
// verifying at all).
type HTTPSServer struct {
	URL    string // https://127.0.0.1:PORT
	CAFile string // PEM of the CA that signed the server's certificate

	srv *httptest.Server
}

// StartHTTPS serves h over HTTPS with a certificate for 127.0.0.1 and
// localhost signed by a CA made in Go for this server, and stops it when
// the test ends.
func StartHTTPS(t T, h http.Handler) *HTTPSServer {
	t.Helper()
	certs, err := writeCerts(t.TempDir())
	if err != nil {
		t.Fatalf("making HTTPS certificates: %v", err)
	}
	cert, err := tls.LoadX509KeyPair(certs.Cert, certs.Key)
	if err != nil {
		t.Fatalf("loading the HTTPS certificate: %v", err)
	}
	srv := httptest.NewUnstartedServer(h)
	// Clients that refuse the certificate are what tests expect, not
	// news for the log.
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return &HTTPSServer{URL: srv.URL, CAFile: certs.CA, srv: srv}
}
