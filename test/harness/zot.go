package harness

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/crypto/bcrypt"
)

// ZotOptions configures StartZot: htpasswd users and zot's per-repository access control.
type ZotOptions struct {
	// Users are the htpasswd users and their passwords.
	Users map[string]string
	// Access maps a repository glob ("acme/**") to the users allowed on it and their actions
	// (read, create, update, delete). Nobody else may do anything there.
	Access map[string]map[string][]string
	// Admins may do AdminActions on every repository (zot's adminPolicy).
	Admins       []string
	AdminActions []string
}

// Zot is a running zot registry (v1.4.3, built by buildtools.sh) on plain HTTP with htpasswd
// authentication and per-repository access control, the kind of registry that gives each tenant
// a credential for its own repositories only.
type Zot struct {
	Host string // "127.0.0.1:PORT"

	proc *proc
}

// StartZot starts zot on a free port of 127.0.0.1 with its storage and config in t.TempDir(),
// waits until GET /v2/ answers 401, and stops it when the test ends. It skips the test when the
// zot binary is not built.
func StartZot(t T, opts ZotOptions) *Zot {
	t.Helper()
	bin := Binary(t, "zot")
	dir := t.TempDir()
	logPath := filepath.Join(dir, "zot.log")
	var htpasswd strings.Builder
	for _, user := range slices.Sorted(maps.Keys(opts.Users)) {
		hash, err := bcrypt.GenerateFromPassword([]byte(opts.Users[user]), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&htpasswd, "%s:%s\n", user, hash)
	}
	if err := os.WriteFile(filepath.Join(dir, "htpasswd"), []byte(htpasswd.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	access := map[string]any{}
	for glob, users := range opts.Access {
		var policies []any
		for _, user := range slices.Sorted(maps.Keys(users)) {
			policies = append(policies, map[string]any{"users": []string{user}, "actions": users[user]})
		}
		access[glob] = map[string]any{"policies": policies, "defaultPolicy": []string{}}
	}
	if len(opts.Admins) > 0 {
		access["adminPolicy"] = map[string]any{"users": opts.Admins, "actions": opts.AdminActions}
	}
	z := &Zot{}
	t.Cleanup(func() {
		if z.proc != nil {
			if err := z.proc.stop(); err != nil {
				t.Errorf("stopping zot: %v", err)
			}
		}
		logOnFailure(t, "zot", logPath)
	})
	probe := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	var err error
	for range startAttempts {
		port := freePort(t)
		z.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		conf := map[string]any{
			"distSpecVersion": "1.0.1-dev",
			"storage":         map[string]any{"rootDirectory": filepath.Join(dir, "storage"), "gc": false, "dedupe": false},
			"http": map[string]any{
				"address": "127.0.0.1", "port": strconv.Itoa(port), "realm": "zot",
				"auth":          map[string]any{"htpasswd": map[string]any{"path": filepath.Join(dir, "htpasswd")}, "failDelay": 0},
				"accessControl": access,
			},
			"log": map[string]any{"level": "info"},
		}
		data, _ := json.MarshalIndent(conf, "", "  ") // maps of strings only: cannot fail
		config := filepath.Join(dir, "config.json")
		if err := os.WriteFile(config, data, 0o600); err != nil {
			t.Fatal(err)
		}
		z.proc, err = startProc(logPath, nil, bin, "serve", config)
		if err != nil {
			t.Fatalf("starting zot: %v", err)
		}
		if err = waitReady(z.proc, httpAnswers(probe, "http://"+z.Host+"/v2/", nil, http.StatusUnauthorized)); !errors.Is(err, errExited) {
			break
		}
	}
	if err != nil {
		t.Fatalf("starting zot: %v (log %s)", err, logPath)
	}
	return z
}
