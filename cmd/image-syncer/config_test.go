package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestConfigFile(t *testing.T) {
	write := func(t *testing.T, body string) string {
		path := filepath.Join(t.TempDir(), "config.yaml")
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	t.Run("sets flags, the command line wins", func(t *testing.T) {
		cmd := newRootCmd()
		path := write(t, "registry: registry.example.com\npoll-interval: 2m\ntenants: [acme, globex]\nkeep: 3\n")
		if err := cmd.ParseFlags([]string{"--config", path, "--keep", "4"}); err != nil {
			t.Fatal(err)
		}
		if err := applyConfigFile(cmd.Flags(), path); err != nil {
			t.Fatal(err)
		}
		get := func(name string) string { return cmd.Flags().Lookup(name).Value.String() }
		if get("registry") != "registry.example.com" || get("poll-interval") != (2*time.Minute).String() ||
			get("tenants") != "[acme,globex]" || get("keep") != "4" {
			t.Errorf("registry %s, poll-interval %s, tenants %s, keep %s", get("registry"), get("poll-interval"), get("tenants"), get("keep"))
		}
	})
	for name, tc := range map[string]struct{ body, want string }{
		"unknown key":      {"registy: x\n", `unknown key "registy"`},
		"bad value":        {"poll-interval: soon\n", "poll-interval"},
		"config in config": {"config: other.yaml\n", `unknown key "config"`},
		"not yaml":         {"registry: [\n", "parsing"},
	} {
		t.Run(name, func(t *testing.T) {
			cmd := newRootCmd()
			err := applyConfigFile(cmd.Flags(), write(t, tc.body))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one mentioning %q", err, tc.want)
			}
		})
	}
}

func TestOptionsValidate(t *testing.T) {
	valid := func() *options {
		o := &options{}
		if err := newRootCmdWith(o).ParseFlags([]string{"--registry", "r.example.com", "--webhook-token-file", "/t", "--gate-keys", "/k"}); err != nil {
			t.Fatal(err)
		}
		return o
	}
	if err := valid().validate(); err != nil {
		t.Fatalf("defaults with a registry and token: %v", err)
	}
	for name, mutate := range map[string]func(*options){
		"no registry":           func(o *options) { o.daemon.Registry = "" },
		"no gate keys":          func(o *options) { o.gateKeys = "" },
		"webhook without token": func(o *options) { o.daemon.WebhookTokenFile = "" },
		"keep 0":                func(o *options) { o.keep = 0 },
		"keep 11":               func(o *options) { o.keep = 11 },
		"negative image limit":  func(o *options) { o.maxImagesPerTenant = -1 },
		"pull method":           func(o *options) { o.pullMethod = "kubelet" },
		"unknown guests":        func(o *options) { o.unknownGuests = "refuse" },
		"on-delete":             func(o *options) { o.onDelete = "purge" },
		"resync below poll":     func(o *options) { o.daemon.DigestResyncInterval = time.Second },
		"log level":             func(o *options) { o.daemon.LogLevel = "loud" },
		"tenant credentials with node pull": func(o *options) {
			o.pullMethod, o.tenantCredentialsDir = "node", "/creds"
		},
	} {
		t.Run(name, func(t *testing.T) {
			o := valid()
			mutate(o)
			if o.validate() == nil {
				t.Error("accepted")
			}
		})
	}
}

// Each listener of the syncer turns off given "" or "0", as the gate's do,
// and a syncer without a webhook needs no webhook token.
func TestListenersTurnOff(t *testing.T) {
	for _, off := range []string{"", "0"} {
		o := &options{}
		args := []string{"--registry", "r.example.com", "--gate-keys", "/k", "--webhook-listen", off, "--metrics-listen", off, "--health-listen", off}
		if err := newRootCmdWith(o).ParseFlags(args); err != nil {
			t.Fatal(err)
		}
		if o.daemon.WebhookListen != "" || o.daemon.MetricsListen != "" || o.daemon.HealthListen != "" {
			t.Errorf("given %q: webhook %q, metrics %q, health %q; want all off", off, o.daemon.WebhookListen, o.daemon.MetricsListen, o.daemon.HealthListen)
		}
		if err := o.validate(); err != nil {
			t.Errorf("given %q: %v", off, err)
		}
	}
}

// TestNamespaceTemplateRefused: a template that puts two tenants into one
// namespace stops the syncer at start with a message naming both tenants
// and the namespace.
func TestNamespaceTemplateRefused(t *testing.T) {
	cmd := newRootCmd()
	cmd.SetArgs([]string{"--registry", "r.example.com", "--webhook-token-file", "/t", "--namespace-template", `{{printf "%.3s" .Tenant}}`})
	err := cmd.Execute()
	if err == nil {
		t.Fatal("the syncer started with a template mapping tenant-a and tenant-b to one namespace")
	}
	for _, want := range []string{"--namespace-template", `maps tenants "tenant-a" and "tenant-b" to the same namespace "ten"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}
