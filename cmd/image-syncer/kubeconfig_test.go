package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/imagepipe/imagepipe/internal/need"
)

// writeKubeconfig writes a kubeconfig whose current context names server.
func writeKubeconfig(t *testing.T, dir, server string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "config")
	body := `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "` + server + `"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestKubeconfigOrder: --help states the order in which the hub's
// kubeconfig is looked for, and that is the order restConfig follows:
// --kubeconfig beats $KUBECONFIG, which beats the in-cluster configuration,
// which beats ~/.kube/config. A source that is given but broken is an
// error, never a silent fall-back to the next (another cluster's).
func TestKubeconfigOrder(t *testing.T) {
	const order = "--kubeconfig, $KUBECONFIG, in-cluster, ~/.kube/config"
	cmd := newRootCmd()
	if !strings.Contains(cmd.Long, "hub kubeconfig:          "+order+"\n") {
		t.Errorf("--help does not state the order %q:\n%s", order, cmd.Long)
	}
	if usage := cmd.Flags().Lookup("kubeconfig").Usage; !strings.Contains(usage, "$KUBECONFIG, then in-cluster, then ~/.kube/config") {
		t.Errorf("--kubeconfig's help %q does not state the order", usage)
	}
	if _, err := os.Stat("/var/run/secrets/kubernetes.io/serviceaccount/token"); err == nil {
		need.Allow(t, "in-cluster", "this machine has a service account token, so in-cluster would apply")
	}

	dir := t.TempDir()
	flagFile := writeKubeconfig(t, filepath.Join(dir, "flag"), "https://flag.example:6443")
	envFile := writeKubeconfig(t, filepath.Join(dir, "env"), "https://env.example:6443")
	home := filepath.Join(dir, "home")
	writeKubeconfig(t, filepath.Join(home, ".kube"), "https://home.example:6443")
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name                 string
		flag, env, home      string
		inCluster            bool
		wantHost, wantSource string
		wantErr              string
	}{
		{name: "flag beats everything", flag: flagFile, env: envFile, home: home, inCluster: true, wantHost: "https://flag.example:6443", wantSource: "--kubeconfig"},
		{name: "$KUBECONFIG beats in-cluster and home", env: envFile, home: home, inCluster: true, wantHost: "https://env.example:6443", wantSource: "$KUBECONFIG"},
		{name: "$KUBECONFIG lists files, the missing ones skipped", env: filepath.Join(dir, "missing") + string(filepath.ListSeparator) + envFile, home: home, wantHost: "https://env.example:6443", wantSource: "$KUBECONFIG"},
		// The service account token of this machine's pods is missing
		// here, so in-cluster applies and fails: it was tried before home.
		{name: "in-cluster beats home", home: home, inCluster: true, wantErr: "(in-cluster): in a pod"},
		{name: "home last", home: home, wantHost: "https://home.example:6443", wantSource: "~/.kube/config"},
		{name: "a missing --kubeconfig is an error", flag: filepath.Join(dir, "missing"), env: envFile, home: home, wantErr: "(--kubeconfig): stat"},
		{name: "an empty --kubeconfig is an error", flag: empty, env: envFile, home: home, wantErr: "(--kubeconfig): " + empty + ": missing or empty"},
		{name: "a $KUBECONFIG naming no file is an error", env: filepath.Join(dir, "missing"), home: home, wantErr: "($KUBECONFIG): " + filepath.Join(dir, "missing") + ": missing or empty"},
		{name: "nothing", home: filepath.Join(dir, "nohome"), wantErr: "no kubeconfig for the hub"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("KUBECONFIG", tc.env)
			t.Setenv("HOME", tc.home)
			host, port := "", ""
			if tc.inCluster {
				host, port = "10.0.0.1", "443"
			}
			t.Setenv("KUBERNETES_SERVICE_HOST", host)
			t.Setenv("KUBERNETES_SERVICE_PORT", port)
			cfg, source, err := restConfig(tc.flag)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q (got host %v from %q)", err, tc.wantErr, cfg, source)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Host != tc.wantHost || source != tc.wantSource {
				t.Errorf("host %s from %s, want %s from %s", cfg.Host, source, tc.wantHost, tc.wantSource)
			}
		})
	}
}

// TestLeaderElectionNamespaceOrder: the lease's namespace is the flag's,
// else $POD_NAMESPACE, else the service account's namespace file, else
// imagepipe-system, and the source is named. A value that is not a
// namespace name is refused, naming where it came from.
func TestLeaderElectionNamespaceOrder(t *testing.T) {
	dir := t.TempDir()
	n := 0
	file := func(content string) string {
		n++
		path := filepath.Join(dir, strconv.Itoa(n))
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	sa := file("from-sa\n")
	missing := filepath.Join(dir, "missing")
	for _, tc := range []struct {
		name                     string
		flag, env, file          string
		wantNS, wantSrc, wantErr string
	}{
		{"flag first", "from-flag", "from-env", sa, "from-flag", "--leader-election-namespace", ""},
		{"then $POD_NAMESPACE", "", "from-env", sa, "from-env", "$POD_NAMESPACE", ""},
		{"then the service account", "", "", sa, "from-sa", sa, ""},
		{"then the default", "", "", missing, "imagepipe-system", "default", ""},
		{"an empty service account file counts as none", "", "", file(" \n"), "imagepipe-system", "default", ""},
		{"a bad flag value", "Not_A_Namespace", "from-env", sa, "", "", "--leader-election-namespace is not a namespace name"},
		{"a bad $POD_NAMESPACE", "", "../etc", sa, "", "", "$POD_NAMESPACE is not a namespace name"},
		{"a bad file", "", "", file("two\nlines"), "", "", "is not a namespace name"},
		{"an oversized file", "", "", file(strings.Repeat("a", 1000)), "", "", "is not a namespace name"},
		{"a folder where the file should be", "", "", dir, "", "", "reading the service account's namespace"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns, src, err := leaderElectionNamespace(tc.flag, tc.env, tc.file)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("namespace %q from %q, error %v; want an error containing %q", ns, src, err, tc.wantErr)
				}
				return
			}
			if err != nil || ns != tc.wantNS || src != tc.wantSrc {
				t.Errorf("namespace %q from %q (error %v), want %q from %q", ns, src, err, tc.wantNS, tc.wantSrc)
			}
		})
	}
	if usage := newRootCmd().Flags().Lookup("leader-election-namespace").Usage; !strings.Contains(usage, "$POD_NAMESPACE, then the pod's service account namespace, then imagepipe-system") {
		t.Errorf("--leader-election-namespace's help %q does not state the order", usage)
	}
}
