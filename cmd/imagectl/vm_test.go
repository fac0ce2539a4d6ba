package main

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/imagepipe/imagepipe/pkg/api"
)

// TestVMCreateWaitFlagsAreCheckedFirst: --wait and --timeout combinations
// that cannot mean anything fail before any file, registry or hub is
// touched (the kubeconfig and template named here do not exist).
func TestVMCreateWaitFlagsAreCheckedFirst(t *testing.T) {
	base := []string{"vm", "create", "web", "--image", "acme/rhel:9", "--template-file", "/nonexistent/t.yaml", "--kubeconfig", "/nonexistent/kubeconfig"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--wait", "--dry-run"}, "--wait has nothing to wait for with --dry-run"},
		{[]string{"--timeout", "1m"}, "--timeout bounds --wait; add --wait"},
		{[]string{"--wait", "--timeout", "0s"}, "--timeout 0s: want a positive duration"},
		{[]string{"--wait", "--timeout", "-5s"}, "--timeout -5s: want a positive duration"},
		{[]string{"--wait", "--timeout", "5"}, `invalid argument "5" for "--timeout"`},
	} {
		root := newRootCmd()
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&out)
		root.SetArgs(append(append([]string{}, base...), tc.args...))
		err := root.ExecuteContext(t.Context())
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("vm create %s: %v; want %q", strings.Join(tc.args, " "), err, tc.want)
		}
	}
}

// TestVMCreateRefusesAPrivateSSHKey: vm create --ssh-key naming a private
// key (ssh-keygen's id_ed25519 instead of id_ed25519.pub) fails on the
// key, naming the file, before the hub is asked anything: the kubeconfig
// named here does not exist, so an error about it would mean the key was
// let through towards a Secret.
func TestVMCreateRefusesAPrivateSSHKey(t *testing.T) {
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(key, "alice@example.com")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tmpl, private := filepath.Join(dir, "simple_vm.yaml"), filepath.Join(dir, "id_ed25519")
	if err := os.WriteFile(tmpl, []byte("id: simple_vm\ntitle: Simple VM\nvm:\n  memory: 1Gi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(private, pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatal(err)
	}
	root := newRootCmd()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs([]string{"vm", "create", "web", "--image", "acme/rhel:9", "--template-file", tmpl, "--ssh-key", private,
		"--kubeconfig", filepath.Join(dir, "no-kubeconfig"), "--dry-run"})
	err = root.ExecuteContext(t.Context())
	if err == nil || !strings.Contains(err.Error(), "--ssh-key "+private+": ") || !strings.Contains(err.Error(), "is not an SSH public key (is it the private key?)") {
		t.Fatalf("vm create --ssh-key %s: %v; want the private key refused, naming the file", private, err)
	}
	if f := describe(err); f.ExitCode != exitError {
		t.Errorf("exit code %d, want %d", f.ExitCode, exitError)
	}
	if strings.Contains(out.String(), "PRIVATE KEY") {
		t.Errorf("the private key reached the output:\n%s", out.String())
	}
}

// TestConditionsShowTheirLastTransition: the CONDITIONS column of vm list
// -o wide says how long ago each condition that holds last changed, when
// KubeVirt says so.
func TestConditionsShowTheirLastTransition(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	conds := []api.VMCondition{
		{Type: "Ready", Status: "True", LastTransitionTime: now.Add(-5 * time.Minute).Format(time.RFC3339)},
		{Type: "Failed", Status: "False", LastTransitionTime: now.Add(-time.Hour).Format(time.RFC3339)},
		{Type: "Progressing", Status: "True"},
	}
	if got, want := trueConditions(conds, now), "Ready(5m),Progressing"; got != want {
		t.Errorf("trueConditions = %q, want %q", got, want)
	}
}
