package registry

import (
	"net/http"
	"strings"
	"testing"
)

// recordingTransport records the requests that reach it.
type recordingTransport struct{ hosts []string }

func (r *recordingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	r.hosts = append(r.hosts, req.URL.Host)
	return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody, Request: req}, nil
}

// TestPlainHTTPOnlyToLoopback: without --insecure a plain HTTP request
// leaves only for a loopback address or localhost; to any other host it is
// refused before it reaches the network, naming --insecure. HTTPS goes
// everywhere. test/registry's TestNoCredentialsInClearToAPrivateAddress
// checks the same with imagectl against a listener on 10.55.0.1.
func TestPlainHTTPOnlyToLoopback(t *testing.T) {
	tests := []struct {
		url  string
		sent bool
	}{
		{"http://127.0.0.1:5000/v2/", true},
		{"http://127.8.9.10:5000/v2/", true},
		{"http://localhost:5000/v2/", true},
		{"http://[::1]:5000/v2/", true},
		{"https://10.55.0.1:5000/v2/", true},
		{"http://10.55.0.1:5000/v2/", false},
		{"http://192.168.1.4/v2/", false},
		{"http://registry.example/v2/", false},
		{"http://localhost.example/v2/", false},
	}
	for _, tc := range tests {
		inner := &recordingTransport{}
		req, err := http.NewRequest(http.MethodGet, tc.url, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Basic dGVuYW50OnMzY3JldA==")
		resp, err := plainHTTPGuard{inner: inner}.RoundTrip(req)
		if resp != nil {
			resp.Body.Close()
		}
		if sent := len(inner.hosts) == 1; sent != tc.sent {
			t.Errorf("%s: sent %v, want %v", tc.url, sent, tc.sent)
		}
		if !tc.sent && (err == nil || !strings.Contains(err.Error(), "refusing plain HTTP to "+req.URL.Host) || !strings.Contains(err.Error(), "--insecure")) {
			t.Errorf("%s: %v, want refused naming the host and --insecure", tc.url, err)
		}
	}
}
