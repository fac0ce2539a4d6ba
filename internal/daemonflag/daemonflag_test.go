package daemonflag

import (
	"log/slog"
	"testing"
)

func TestRegistry(t *testing.T) {
	reg, err := Registry("registry.example.com:5000", false)
	if err != nil || reg.Scheme() != "https" || reg.RegistryStr() != "registry.example.com:5000" {
		t.Errorf("Registry: %v scheme %s (%v)", reg, reg.Scheme(), err)
	}
	if reg, err := Registry("10.55.0.1:5000", true); err != nil || reg.Scheme() != "http" {
		t.Errorf("an insecure registry: scheme %s (%v), want http", reg.Scheme(), err)
	}
	if _, err := Registry("bad host", false); err == nil {
		t.Error("a registry name with a space accepted")
	}
}

func TestLevel(t *testing.T) {
	for s, want := range map[string]slog.Level{"debug": slog.LevelDebug, "INFO": slog.LevelInfo, "Warn": slog.LevelWarn, "error": slog.LevelError} {
		if l, err := Level(s); err != nil || l != want {
			t.Errorf("Level(%q) = %v (%v), want %v", s, l, err, want)
		}
	}
	if _, err := Level("loud"); err == nil {
		t.Error("an unknown level accepted")
	}
}
