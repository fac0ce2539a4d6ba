package source

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// maxRedirects is how many redirects the default client follows.
const maxRedirects = 5

// defaultHTTPClient has timeouts for every step before the body, and none
// on the body itself: a large image may take hours on a slow link, and a
// dead peer is found by TCP keep-alives. tlsConf, when not nil, replaces
// Go's default TLS settings.
func defaultHTTPClient(tlsConf *tls.Config) *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.DialContext = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	t.TLSHandshakeTimeout = 15 * time.Second
	t.ResponseHeaderTimeout = time.Minute
	t.ExpectContinueTimeout = time.Second
	if tlsConf != nil {
		t.TLSClientConfig = tlsConf.Clone()
	}
	return &http.Client{Transport: t, CheckRedirect: checkRedirect}
}

// tlsConfig is the TLS configuration that Options.CAFile and
// Options.InsecureSkipVerify ask for: the system's roots plus the file's
// certificates, or no verification at all. It is nil when neither is set,
// which keeps Go's defaults.
func tlsConfig(caFile string, insecure bool) (*tls.Config, error) {
	if caFile == "" && !insecure {
		return nil, nil
	}
	conf := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: insecure}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("reading the CA file: %w", err)
		}
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("no PEM certificates in the CA file %s", caFile)
		}
		conf.RootCAs = pool
	}
	return conf, nil
}

func checkRedirect(_ *http.Request, via []*http.Request) error {
	if len(via) > maxRedirects {
		return fmt.Errorf("stopped after %d redirects", maxRedirects)
	}
	return nil
}

// httpClient returns Options.HTTPClient, limited to maxRedirects when it
// has no redirect policy of its own, or the default client.
func (o *config) httpClient() *http.Client {
	if o.HTTPClient == nil {
		return defaultHTTPClient(o.tls)
	}
	if o.HTTPClient.CheckRedirect != nil {
		return o.HTTPClient
	}
	c := *o.HTTPClient
	c.CheckRedirect = checkRedirect
	return &c
}

// openHTTP downloads an http(s) URL with one GET, resuming it with Range
// requests when the server advertises Accept-Ranges: bytes and a version
// to pin them to (httpReopen).
func openHTTP(ctx context.Context, rawURL string, o *config) (*Image, error) {
	client := o.httpClient()
	resp, err := httpGet(ctx, client, rawURL, nil)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, fmt.Errorf("the server answered %s", resp.Status)
	}
	if resp.ContentLength > o.maxSize {
		resp.Body.Close()
		return nil, tooLarge(resp.ContentLength, o.maxSize)
	}
	body := &resumingReader{ctx: ctx, body: resp.Body, size: resp.ContentLength, log: o.log}
	defer body.Close()
	if acceptsRanges(resp.Header) {
		body.reopen = httpReopen(client, resp)
	}
	o.log.Debug("downloading", "url", redactURL(resp.Request.URL), "bytes", resp.ContentLength, "resumable", body.reopen != nil)
	return o.spool(ctx, body, resp.ContentLength, nil)
}

// httpGet sends a GET asking for the bytes as stored: the transport would
// otherwise ask for gzip and transparently decode it, and the digest would
// not be of the original bytes.
func httpGet(ctx context.Context, client *http.Client, rawURL string, header http.Header) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rawURL, nil)
	if err != nil {
		return nil, stripURL(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	req.Header.Set("Accept-Encoding", "identity")
	resp, err := client.Do(req)
	if err != nil {
		return nil, stripURL(err)
	}
	return resp, nil
}

// stripURL removes the *url.Error layer, whose message repeats the full URL
// with its query string; Open names the source itself, redacted.
func stripURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

func acceptsRanges(h http.Header) bool {
	for _, v := range h.Values("Accept-Ranges") {
		for _, tok := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), "bytes") {
				return true
			}
		}
	}
	return false
}

// httpReopen resumes the download of first's final URL, pinned with
// If-Range to the version first served, so a changed object fails instead
// of splicing two versions. It is nil when first has neither a strong ETag
// nor a Last-Modified: nothing would tell a changed object apart.
func httpReopen(client *http.Client, first *http.Response) reopenFunc {
	finalURL := first.Request.URL.String()
	validator, field := first.Header.Get("ETag"), "ETag"
	if validator == "" || strings.HasPrefix(validator, "W/") {
		validator, field = first.Header.Get("Last-Modified"), "Last-Modified"
	}
	if validator == "" {
		return nil
	}
	total := first.ContentLength
	return func(ctx context.Context, off int64) (io.ReadCloser, bool, error) {
		h := http.Header{}
		h.Set("Range", "bytes="+strconv.FormatInt(off, 10)+"-")
		h.Set("If-Range", validator)
		resp, err := httpGet(ctx, client, finalURL, h)
		if err != nil {
			return nil, ctx.Err() != nil, err
		}
		switch {
		case resp.StatusCode == http.StatusPartialContent:
			start, ok := contentRangeStart(resp.Header.Get("Content-Range"))
			if !ok || start != off {
				resp.Body.Close()
				return nil, true, fmt.Errorf("the server answered range %q for bytes from %d", resp.Header.Get("Content-Range"), off)
			}
			// A server that ignores If-Range still names the version its
			// range comes from (RFC 9110, 15.3.7).
			if got := resp.Header.Get(field); (got != "" && got != validator) || !rangeOfSize(resp.Header.Get("Content-Range"), total) {
				resp.Body.Close()
				return nil, true, fmt.Errorf("the object has changed since the download began: the rest came as %s %q, range %q", field, got, resp.Header.Get("Content-Range"))
			}
			return resp.Body, false, nil
		case resp.StatusCode == http.StatusOK:
			resp.Body.Close()
			return nil, true, errors.New("the server sent the whole object instead of the rest; it has changed or ignores ranges")
		default:
			resp.Body.Close()
			permanent := resp.StatusCode < 500 && resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode != http.StatusRequestTimeout
			return nil, permanent, fmt.Errorf("the server answered %s to a range request", resp.Status)
		}
	}
}

// rangeOfSize reports whether the Content-Range v, "bytes START-END/SIZE",
// is of an object of total bytes; true when either is unknown.
func rangeOfSize(v string, total int64) bool {
	_, size, ok := strings.Cut(v, "/")
	if !ok || size == "*" || total < 0 {
		return true
	}
	n, err := strconv.ParseInt(size, 10, 64)
	return err != nil || n == total
}

// contentRangeStart parses the first byte of "bytes START-END/SIZE".
func contentRangeStart(v string) (int64, bool) {
	rest, ok := strings.CutPrefix(v, "bytes ")
	if !ok {
		return 0, false
	}
	start, _, ok := strings.Cut(rest, "-")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(start), 10, 64)
	return n, err == nil
}
