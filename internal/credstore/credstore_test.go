package credstore

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSaveReadErase: credentials Save stores are what Read finds in the
// config file it names, for the host only; Erase removes them and says
// whether there were any. Read refuses a file over its bound.
func TestSaveReadErase(t *testing.T) {
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	path, err := Save("registry.example:5000", "tenant", "s3cret")
	if err != nil {
		t.Fatal(err)
	}
	user, pass, err := Read(path, "registry.example:5000")
	if err != nil || user != "tenant" || pass != "s3cret" {
		t.Fatalf("Read: %q, %q, %v", user, pass, err)
	}
	if _, _, err := Read(path, "other.example"); err == nil {
		t.Error("Read found credentials for a host that has none")
	}
	if had, _, err := Erase("registry.example:5000"); err != nil || !had {
		t.Fatalf("Erase: %v, %v", had, err)
	}
	if _, _, err := Read(path, "registry.example:5000"); err == nil {
		t.Error("Read found credentials after Erase")
	}
	if had, _, err := Erase("registry.example:5000"); err != nil || had {
		t.Errorf("a second Erase: %v, %v", had, err)
	}

	big := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(big, []byte(`{"auths":{}, "x":"`+strings.Repeat("x", maxCredentialFile)+`"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Read(big, "registry.example:5000"); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("Read of an oversized file: %v", err)
	}
}
