package main

import "testing"

// Each listener of the gate turns off given "" or "0", as the syncer's do,
// and a gate without a webhook needs no webhook token.
func TestListenersTurnOff(t *testing.T) {
	for _, off := range []string{"", "0"} {
		o := &options{}
		args := []string{"--registry", "r.example.com", "--signing-key", "/k", "--webhook-listen", off, "--metrics-listen", off, "--health-listen", off}
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
