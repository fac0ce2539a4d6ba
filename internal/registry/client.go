package registry

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/imagepipe/imagepipe/internal/cachefile"
)

// DefaultChunkSize is the size of one PATCH of a chunked blob upload: the
// most that is ever sent twice after a connection breaks.
const DefaultChunkSize = 8 << 20

// Client talks to OCI registries. It is safe for concurrent use.
type Client struct {
	opts  options
	cache cacheDir
	base  http.RoundTripper // every request goes through it, observed when asked

	mu       sync.Mutex
	schemes  map[string]string        // registry host → "https" or "http"
	sessions map[string]cachedSession // registry host → authenticated transport
	// noReferrersAPI holds when repositories ("HOST/REPO") answered that
	// their registry has no referrers API (referrersProbe): their referrers
	// tag is read directly.
	noReferrersAPI map[string]time.Time
}

type options struct {
	keychain  authn.Keychain
	auth      authn.Authenticator
	caFile    string
	insecure  bool
	logger    *slog.Logger
	chunkSize int
	cacheDir  string
	retries   int
	backoff   time.Duration
	userAgent string
	observer  RequestObserver
	// platform is the image an index resolves to (DefaultPlatform when
	// nil); with it set, images outside an index must be for it too.
	platform *Platform
	// platformWhy says who asked for platform, in rejections.
	platformWhy string
}

// Option configures a Client.
type Option func(*options) error

// withKeychain resolves credentials per registry; the default is
// authn.DefaultKeychain (~/.docker/config.json and credential helpers).
func withKeychain(k authn.Keychain) Option {
	return func(o *options) error { o.keychain = k; return nil }
}

// WithBasicAuth uses a fixed username and password for every registry.
func WithBasicAuth(username, password string) Option {
	return func(o *options) error {
		if username == "" {
			return errors.New("basic auth needs a username")
		}
		o.auth = &authn.Basic{Username: username, Password: password}
		return nil
	}
}

// WithCAFile trusts the PEM certificates in path as well as the system's.
func WithCAFile(path string) Option {
	return func(o *options) error { o.caFile = path; return nil }
}

// WithInsecure skips TLS verification and allows plain HTTP. Without it
// only registries on loopback addresses and localhost may use plain HTTP:
// credentials never cross a network in clear.
func WithInsecure(insecure bool) Option {
	return func(o *options) error { o.insecure = insecure; return nil }
}

// WithArchitecture is the platform option of a hub's syncer: like
// WithPlatform(linux/arch), its rejections saying "this hub runs arch". An
// image index resolves to its linux image for arch (of any variant), and
// an image built for another architecture is rejected
// (reject.PlatformMismatch). "" sets nothing.
func WithArchitecture(arch string) Option {
	return func(o *options) error {
		if arch != "" {
			o.platform = &Platform{OS: "linux", Architecture: arch}
			o.platformWhy = "this hub runs " + arch
		}
		return nil
	}
}

// WithPlatform makes PlatformImage (and so internal/diskimage) resolve to
// p: an image index resolves to its one image for p (a p without a
// variant matching every variant of its architecture), and an image outside an
// index must be built for p; both are reject.PlatformMismatch otherwise.
// The default resolves an index to its linux/amd64 image
// (DefaultPlatform) and takes an image outside an index as it is.
func WithPlatform(p Platform) Option {
	return func(o *options) error {
		if err := p.validate(); err != nil {
			return err
		}
		o.platform = &p
		o.platformWhy = p.String() + " was asked for"
		return nil
	}
}

// WithLogger sets the logger; the default discards.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) error { o.logger = l; return nil }
}

// WithChunkSize sets the blob upload chunk size (default DefaultChunkSize,
// at least 1 MiB).
func WithChunkSize(n int) Option {
	return func(o *options) error {
		if n < 1<<20 {
			return fmt.Errorf("chunk size %d is under 1 MiB", n)
		}
		o.chunkSize = n
		return nil
	}
}

// WithCacheDir sets where the client remembers interrupted uploads (so
// that a later run resumes them) and where it pushed each build (so that
// an import into another repository mounts instead of uploading); ""
// disables both. The default is $IMAGEPIPE_CACHE, else ~/.cache/imagepipe.
func WithCacheDir(dir string) Option {
	return func(o *options) error { o.cacheDir = dir; return nil }
}

// WithRetry sets how often a failed request is retried and the first
// backoff, which doubles each time (default 6 tries from 250ms: about 8 s).
func WithRetry(tries int, backoff time.Duration) Option {
	return func(o *options) error {
		if tries < 1 || backoff <= 0 {
			return errors.New("retry needs at least one try and a positive backoff")
		}
		o.retries, o.backoff = tries, backoff
		return nil
	}
}

// WithUserAgent sets the User-Agent sent with every request.
func WithUserAgent(ua string) Option {
	return func(o *options) error { o.userAgent = ua; return nil }
}

// RequestObserver is told of each HTTP request a Client sends, once, when
// it completes: its method, URL path and response status (0 when no
// response came). It sees everything on the wire: registry API calls, each
// retry, the GET /v2/ that opens a session, and requests to a token
// endpoint (their path is the token realm's, e.g. "/token" or
// "/service/token"), so a count of requests is what the registry and its
// token service actually served. It is called from many goroutines and
// must be quick.
type RequestObserver func(method, path string, status int)

// WithRequestObserver calls f for every HTTP request the client sends, for
// request metrics and cost measurements; the default observes nothing.
func WithRequestObserver(f RequestObserver) Option {
	return func(o *options) error {
		if f == nil {
			return errors.New("the request observer is nil")
		}
		o.observer = f
		return nil
	}
}

// observedTransport reports each round trip to a RequestObserver.
type observedTransport struct {
	inner   http.RoundTripper
	observe RequestObserver
}

func (t observedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.inner.RoundTrip(req)
	status := 0
	if resp != nil {
		status = resp.StatusCode
	}
	t.observe(req.Method, req.URL.Path, status)
	return resp, err
}

// New returns a Client.
func New(opts ...Option) (*Client, error) {
	o := options{
		keychain:  authn.DefaultKeychain,
		logger:    slog.New(slog.DiscardHandler),
		chunkSize: DefaultChunkSize,
		cacheDir:  cachefile.Dir(),
		retries:   6,
		backoff:   250 * time.Millisecond,
		userAgent: "imagepipe",
	}
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	tr := remote.DefaultTransport.(*http.Transport).Clone()
	tlsConf := &tls.Config{MinVersion: tls.VersionTLS12}
	if o.caFile != "" {
		pem, err := os.ReadFile(o.caFile)
		if err != nil {
			return nil, fmt.Errorf("reading CA file: %w", err)
		}
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("no certificates in CA file %s", o.caFile)
		}
		tlsConf.RootCAs = pool
	}
	tlsConf.InsecureSkipVerify = o.insecure
	tr.TLSClientConfig = tlsConf
	var base http.RoundTripper = tr
	if o.observer != nil {
		base = observedTransport{inner: tr, observe: o.observer}
	}
	if !o.insecure {
		base = plainHTTPGuard{inner: base}
	}
	return &Client{opts: o, cache: cacheDir{dir: o.cacheDir, logger: o.logger}, base: base, schemes: map[string]string{}, sessions: map[string]cachedSession{}, noReferrersAPI: map[string]time.Time{}}, nil
}

// authenticator returns the credentials for a registry.
func (c *Client) authenticator(reg name.Registry) (authn.Authenticator, error) {
	if c.opts.auth != nil {
		return c.opts.auth, nil
	}
	a, err := c.opts.keychain.Resolve(reg)
	if err != nil {
		return nil, fmt.Errorf("resolving credentials for %s: %w", reg, err)
	}
	return a, nil
}

// remoteOptions are the go-containerregistry options for one call.
func (c *Client) remoteOptions(ctx context.Context, reg name.Registry) ([]remote.Option, error) {
	auth, err := c.authenticator(reg)
	if err != nil {
		return nil, err
	}
	return []remote.Option{
		remote.WithContext(ctx),
		remote.WithAuth(auth),
		remote.WithTransport(c.base),
		remote.WithUserAgent(c.opts.userAgent),
		remote.WithRetryBackoff(remote.Backoff{Duration: c.opts.backoff, Factor: 2, Steps: c.opts.retries}),
	}, nil
}

// sessionTTL is how long an authenticated transport is kept for reuse.
// Renewing it costs one GET /v2/ (and a token exchange where the registry
// uses tokens), and picks up credentials that changed in the keychain.
const sessionTTL = 10 * time.Minute

// cachedSession is an authenticated transport and when it was made.
type cachedSession struct {
	rt   http.RoundTripper
	made time.Time
}

// session returns an authenticated transport for reg that is kept and
// reused by the calls that only read (catalog, tag listings, look-ups,
// manifests, blobs, referrers), so that each of them costs one request: go-containerregistry
// opens every remote call with a GET /v2/ and, on token registries, a
// token exchange, unless it is handed a transport.Wrapper, as here. Bearer
// tokens are renewed by the transport when the registry challenges them;
// the scopes it asks for grow with the repositories it is challenged for.
// It carries the client's retries and User-Agent, which
// go-containerregistry does not add to a Wrapper.
func (c *Client) session(ctx context.Context, reg name.Registry) (http.RoundTripper, error) {
	return c.cachedSession(ctx, reg, reg.RegistryStr(), reg.Scope(transport.PullScope))
}

// maxSessions bounds the transports kept (one per registry); past it, all
// are dropped and made again.
const maxSessions = 256

// cachedSession returns the transport kept under key, or makes one for
// reg authorised for scope and keeps it for sessionTTL.
func (c *Client) cachedSession(ctx context.Context, reg name.Registry, key, scope string) (http.RoundTripper, error) {
	c.mu.Lock()
	s, ok := c.sessions[key]
	c.mu.Unlock()
	if ok && time.Since(s.made) < sessionTTL {
		return s.rt, nil
	}
	auth, err := c.authenticator(reg)
	if err != nil {
		return nil, err
	}
	var rt http.RoundTripper = transport.NewRetry(referrersProbe{c.base, c.markNoReferrersAPI},
		transport.WithRetryBackoff(remote.Backoff{Duration: c.opts.backoff, Factor: 2, Steps: c.opts.retries}),
		transport.WithRetryStatusCodes(http.StatusRequestTimeout, http.StatusTooManyRequests, http.StatusInternalServerError,
			http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout))
	rt = transport.NewUserAgent(rt, c.opts.userAgent)
	rt, err = transport.NewWithContext(ctx, reg, auth, rt, []string{scope})
	if err != nil {
		if AnsweredInPlainHTTP(err) {
			return nil, fmt.Errorf("authenticating to %s: the registry speaks plain HTTP, not HTTPS (allowed only with --insecure, --registry-insecure on the server side): %w", reg, err)
		}
		return nil, fmt.Errorf("authenticating to %s: %w", reg, err)
	}
	c.mu.Lock()
	if len(c.sessions) >= maxSessions {
		clear(c.sessions)
	}
	c.sessions[key] = cachedSession{rt: rt, made: time.Now()}
	c.mu.Unlock()
	return rt, nil
}

// sessionOptions are the go-containerregistry options for a call that goes
// through the reusable session transport of reg.
func (c *Client) sessionOptions(ctx context.Context, reg name.Registry) ([]remote.Option, error) {
	rt, err := c.session(ctx, reg)
	if err != nil {
		return nil, err
	}
	return []remote.Option{remote.WithContext(ctx), remote.WithTransport(rt)}, nil
}

// httpClient returns a client authorised for scopes on repo, and the
// registry's base URL ("https://host" or "http://host").
func (c *Client) httpClient(ctx context.Context, repo name.Repository, scopes ...string) (*http.Client, *url.URL, error) {
	auth, err := c.authenticator(repo.Registry)
	if err != nil {
		return nil, nil, err
	}
	rt, err := transport.NewWithContext(ctx, repo.Registry, auth, c.base, scopes)
	if err != nil {
		return nil, nil, fmt.Errorf("authenticating to %s: %w", repo.Registry, err)
	}
	rt = transport.NewUserAgent(rt, c.opts.userAgent)
	scheme, err := c.scheme(ctx, repo.Registry)
	if err != nil {
		return nil, nil, err
	}
	return &http.Client{Transport: rt}, &url.URL{Scheme: scheme, Host: repo.RegistryStr()}, nil
}

// scheme finds whether a registry speaks HTTPS, falling back to plain HTTP
// where go-containerregistry would (loopback, private addresses,
// --insecure); plainHTTPGuard then refuses it but for loopback and
// --insecure.
func (c *Client) scheme(ctx context.Context, reg name.Registry) (string, error) {
	c.mu.Lock()
	s, ok := c.schemes[reg.RegistryStr()]
	c.mu.Unlock()
	if ok {
		return s, nil
	}
	s = "https"
	if reg.Scheme() == "http" {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+reg.RegistryStr()+"/v2/", nil)
		if err != nil {
			return "", err
		}
		resp, err := (&http.Client{Transport: c.base, Timeout: 10 * time.Second}).Do(req)
		if err != nil {
			s = "http"
		} else {
			resp.Body.Close()
		}
	}
	c.mu.Lock()
	c.schemes[reg.RegistryStr()] = s
	c.mu.Unlock()
	return s, nil
}

// plainHTTPGuard refuses requests in plain HTTP to anything but a loopback
// address or localhost. go-containerregistry falls back to HTTP for private
// addresses (10.0.0.0/8 and the like) and would send a Basic credential
// there in clear; without --insecure that is refused before a byte is sent.
type plainHTTPGuard struct{ inner http.RoundTripper }

func (g plainHTTPGuard) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme == "http" && !isLoopback(req.URL.Hostname()) {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, &PlainHTTPError{Host: req.URL.Host}
	}
	return g.inner.RoundTrip(req)
}

// PlainHTTPError is the refusal of a request in plain HTTP to a host that
// is not a loopback address, made without WithInsecure: go-containerregistry
// would send a credential there in clear.
type PlainHTTPError struct{ Host string }

func (e *PlainHTTPError) Error() string {
	return fmt.Sprintf("refusing plain HTTP to %s: credentials and images would cross the network unencrypted (--insecure allows it)", e.Host)
}

// AnsweredInPlainHTTP reports whether err is an HTTPS request that the
// server answered in plain HTTP, which net/http reports only in a
// sentence, with no error type to match.
func AnsweredInPlainHTTP(err error) bool {
	return strings.Contains(err.Error(), "server gave HTTP response to HTTPS client")
}

// isLoopback reports whether host is localhost or a loopback address.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
