package daemon

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/spf13/pflag"

	"github.com/imagepipe/imagepipe/internal/credstore"
	"github.com/imagepipe/imagepipe/internal/registry"
)

// Flags are the settings both daemons take, under the same flag names
// with the same defaults. Register fills them from a flag set.
type Flags struct {
	// Registry is the central registry, HOST[:PORT]; required.
	Registry string
	// RegistryCAFile is a PEM CA bundle trusted besides the system's.
	RegistryCAFile string
	// RegistryInsecure allows plain HTTP and skips TLS verification.
	RegistryInsecure bool
	// DockerConfig is a docker config.json holding the daemon's own
	// credential to Registry.
	DockerConfig string
	// WebhookListen is the webhook's address; empty: no webhook.
	WebhookListen string
	// WebhookPath is the webhook's path.
	WebhookPath string
	// WebhookTokenFile holds the bearer token registries must send;
	// required with a webhook.
	WebhookTokenFile string
	// PollInterval is the time between two poll passes (at least 1s).
	PollInterval time.Duration
	// DigestResyncInterval is the time between two full passes, which look
	// up every tag's digest again (at least PollInterval).
	DigestResyncInterval time.Duration
	// MetricsListen is the address of /metrics; empty: not served.
	MetricsListen string
	// HealthListen is the address of /healthz and /readyz; empty: not served.
	HealthListen string
	// LogFormat is json or text.
	LogFormat string
	// LogLevel is debug, info, warn or error, in any case.
	LogLevel string
	// ShutdownTimeout bounds a graceful shutdown.
	ShutdownTimeout time.Duration
}

// Register adds the shared flags to fs, with their defaults. A listener
// flag (--webhook-listen, --metrics-listen, --health-listen) given "" or
// "0" turns its listener off and reads back as "".
func (f *Flags) Register(fs *pflag.FlagSet) {
	fs.StringVar(&f.Registry, "registry", "", "central registry HOST[:PORT] (required)")
	fs.StringVar(&f.RegistryCAFile, "registry-ca-file", "", "PEM CA bundle of the registry")
	fs.BoolVar(&f.RegistryInsecure, "registry-insecure", false, "use plain HTTP or skip TLS verification (127.0.0.1 and localhost use HTTP without it)")
	fs.StringVar(&f.DockerConfig, "docker-config", "", "docker config.json holding this daemon's own credential for --registry")
	listen(fs, &f.WebhookListen, "webhook-listen", ":8080", "address of the webhook endpoint; empty or 0 disables it")
	fs.StringVar(&f.WebhookPath, "webhook-path", "/webhook", "path of the webhook endpoint")
	fs.StringVar(&f.WebhookTokenFile, "webhook-token-file", "", "file holding the bearer token registries must send (required with --webhook-listen)")
	fs.DurationVar(&f.PollInterval, "poll-interval", 5*time.Minute, "how often to list the registry's repositories and tags")
	fs.DurationVar(&f.DigestResyncInterval, "digest-resync-interval", time.Hour, "how often polling also re-resolves the digest of every known tag")
	listen(fs, &f.MetricsListen, "metrics-listen", ":9090", "address of the Prometheus /metrics endpoint; empty or 0 disables it")
	listen(fs, &f.HealthListen, "health-listen", ":8081", "address of /healthz and /readyz; empty or 0 disables them")
	fs.StringVar(&f.LogFormat, "log-format", "json", "log format: json or text")
	fs.StringVar(&f.LogLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.DurationVar(&f.ShutdownTimeout, "shutdown-timeout", 30*time.Second, "how long a graceful shutdown may take")
}

func listen(fs *pflag.FlagSet, p *string, name, value, usage string) {
	*p = value
	fs.Var((*listenAddr)(p), name, usage)
}

// listenAddr is a listener's address; "0", controller-runtime's way of
// saying off, is stored as "", this package's.
type listenAddr string

func (a *listenAddr) Set(s string) error {
	if s == "0" {
		s = ""
	}
	*a = listenAddr(s)
	return nil
}

func (a *listenAddr) String() string { return string(*a) }
func (*listenAddr) Type() string     { return "string" }

// Validate reports every shared flag that is missing or out of range, each
// error naming its flag.
func (f *Flags) Validate() error {
	var errs []error
	if f.Registry == "" {
		errs = append(errs, errors.New("--registry is required"))
	}
	if f.WebhookListen != "" && f.WebhookTokenFile == "" {
		errs = append(errs, errors.New("--webhook-listen needs --webhook-token-file: the endpoint is never open"))
	}
	if f.PollInterval < time.Second {
		errs = append(errs, fmt.Errorf("--poll-interval %s is below 1s", f.PollInterval))
	}
	if f.DigestResyncInterval < f.PollInterval {
		errs = append(errs, fmt.Errorf("--digest-resync-interval %s is below --poll-interval %s", f.DigestResyncInterval, f.PollInterval))
	}
	if _, err := f.Level(); err != nil {
		errs = append(errs, err)
	}
	if f.LogFormat != "json" && f.LogFormat != "text" {
		errs = append(errs, fmt.Errorf("--log-format %q: want json or text", f.LogFormat))
	}
	return errors.Join(errs...)
}

// RegistryName is --registry with --registry-insecure in it, where
// go-containerregistry reads it; every name on the registry derives from
// it (registry.NameOptions).
func (f *Flags) RegistryName() (name.Registry, error) {
	var opts []name.Option
	if f.RegistryInsecure {
		opts = append(opts, name.Insecure)
	}
	reg, err := name.NewRegistry(f.Registry, opts...)
	if err != nil {
		return name.Registry{}, fmt.Errorf("--registry %q: %w", f.Registry, err)
	}
	return reg, nil
}

// RegistryClient is the client of --registry with the daemon's own
// credential (--docker-config) and CA (--registry-ca-file), sending
// userAgent, with no cache directory: a daemon resumes no upload. opts
// come after these.
func (f *Flags) RegistryClient(userAgent string, log *slog.Logger, opts ...registry.Option) (*registry.Client, error) {
	reg, err := f.RegistryName()
	if err != nil {
		return nil, err
	}
	ropts := []registry.Option{
		registry.WithLogger(log), registry.WithCacheDir(""), registry.WithInsecure(f.RegistryInsecure),
		registry.WithUserAgent(userAgent),
	}
	if f.DockerConfig != "" {
		user, pass, err := credstore.Read(f.DockerConfig, reg.RegistryStr())
		if err != nil {
			return nil, err
		}
		ropts = append(ropts, registry.WithBasicAuth(user, pass))
	}
	if f.RegistryCAFile != "" {
		ropts = append(ropts, registry.WithCAFile(f.RegistryCAFile))
	}
	return registry.New(append(ropts, opts...)...)
}

// Handler is the log handler of --log-format at --log-level, writing to w.
func (f *Flags) Handler(w io.Writer) (slog.Handler, error) {
	l, err := f.Level()
	if err != nil {
		return nil, err
	}
	hopts := &slog.HandlerOptions{Level: l}
	if f.LogFormat == "text" {
		return slog.NewTextHandler(w, hopts), nil
	}
	return slog.NewJSONHandler(w, hopts), nil
}

// Level is --log-level: debug, info, warn or error, in any case.
func (f *Flags) Level() (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.ToUpper(f.LogLevel))); err != nil {
		return 0, fmt.Errorf("--log-level %q: want debug, info, warn or error", f.LogLevel)
	}
	return l, nil
}
