package daemon

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// parse registers the shared flags on a new flag set and parses args.
func parse(t *testing.T, args ...string) *Flags {
	t.Helper()
	var f Flags
	fs := pflag.NewFlagSet("daemon", pflag.ContinueOnError)
	f.Register(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return &f
}

func TestRegistryName(t *testing.T) {
	reg, err := parse(t, "--registry", "registry.example.com:5000").RegistryName()
	if err != nil || reg.Scheme() != "https" || reg.RegistryStr() != "registry.example.com:5000" {
		t.Errorf("RegistryName: %v scheme %s (%v)", reg, reg.Scheme(), err)
	}
	if reg, err := parse(t, "--registry", "10.55.0.1:5000", "--registry-insecure").RegistryName(); err != nil || reg.Scheme() != "http" {
		t.Errorf("an insecure registry: scheme %s (%v), want http", reg.Scheme(), err)
	}
	if _, err := parse(t, "--registry", "bad host").RegistryName(); err == nil {
		t.Error("a registry name with a space accepted")
	}
}

func TestLevel(t *testing.T) {
	for s, want := range map[string]slog.Level{"debug": slog.LevelDebug, "INFO": slog.LevelInfo, "Warn": slog.LevelWarn, "error": slog.LevelError} {
		if l, err := parse(t, "--log-level", s).Level(); err != nil || l != want {
			t.Errorf("Level(%q) = %v (%v), want %v", s, l, err, want)
		}
	}
	if _, err := parse(t, "--log-level", "loud").Level(); err == nil {
		t.Error("an unknown level accepted")
	}
}

// Every listener is on by default, and off when given "" or "0" (the
// syncer's documented spelling before the two daemons shared their flags).
func TestListenersTurnOff(t *testing.T) {
	on := parse(t)
	if on.WebhookListen != ":8080" || on.MetricsListen != ":9090" || on.HealthListen != ":8081" {
		t.Errorf("defaults: webhook %q, metrics %q, health %q", on.WebhookListen, on.MetricsListen, on.HealthListen)
	}
	for _, off := range []string{"", "0"} {
		f := parse(t, "--webhook-listen", off, "--metrics-listen", off, "--health-listen", off)
		if f.WebhookListen != "" || f.MetricsListen != "" || f.HealthListen != "" {
			t.Errorf("given %q: webhook %q, metrics %q, health %q; want all off", off, f.WebhookListen, f.MetricsListen, f.HealthListen)
		}
	}
	if f := parse(t, "--metrics-listen", ":0"); f.MetricsListen != ":0" {
		t.Errorf("--metrics-listen :0 (any free port) read as %q", f.MetricsListen)
	}
}

func TestValidate(t *testing.T) {
	if err := parse(t, "--registry", "r.example.com", "--webhook-token-file", "/t").Validate(); err != nil {
		t.Fatalf("defaults with a registry and a token: %v", err)
	}
	if err := parse(t, "--registry", "r.example.com", "--webhook-listen", "0").Validate(); err != nil {
		t.Errorf("no webhook, so no token: %v", err)
	}
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"no registry":       {[]string{"--webhook-token-file", "/t"}, "--registry is required"},
		"webhook no token":  {[]string{"--registry", "r"}, "--webhook-token-file"},
		"poll below 1s":     {[]string{"--registry", "r", "--webhook-listen", "", "--poll-interval", "10ms"}, "--poll-interval"},
		"resync below poll": {[]string{"--registry", "r", "--webhook-listen", "", "--digest-resync-interval", "1m"}, "--digest-resync-interval"},
		"log level":         {[]string{"--registry", "r", "--webhook-listen", "", "--log-level", "loud"}, "--log-level"},
		"log format":        {[]string{"--registry", "r", "--webhook-listen", "", "--log-format", "xml"}, "--log-format"},
	} {
		t.Run(name, func(t *testing.T) {
			err := parse(t, tc.args...).Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one naming %s", err, tc.want)
			}
		})
	}
}
