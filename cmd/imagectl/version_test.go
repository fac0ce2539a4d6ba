package main

import (
	"bytes"
	"encoding/json"
	"runtime"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/imagepipe/imagepipe/internal/version"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// runImagectl runs imagectl with args in-process and returns its standard
// output.
func runImagectl(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRootCmd()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(args)
	err := root.ExecuteContext(t.Context())
	return out.String(), err
}

// stampVersion sets the link-time version for one test, as -ldflags does.
func stampVersion(t *testing.T, v string) {
	old := version.Version
	version.Version = v
	t.Cleanup(func() { version.Version = old })
}

func TestVersionJSON(t *testing.T) {
	stampVersion(t, "v1.2.3-test")
	out, err := runImagectl(t, "version", "-o", "json")
	if err != nil {
		t.Fatalf("imagectl version -o json: %v", err)
	}
	// The keys are the stable contract scripts read.
	var keys map[string]any
	if err := json.Unmarshal([]byte(out), &keys); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out)
	}
	for _, k := range []string{"version", "modified", "goVersion", "platform"} {
		if _, ok := keys[k]; !ok {
			t.Errorf("key %q missing from %s", k, out)
		}
	}
	var got api.VersionInfo
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("decoding %s: %v", out, err)
	}
	want := api.VersionInfo(version.Get())
	if got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if got.Version != "v1.2.3-test" || got.GoVersion != runtime.Version() || got.Platform != runtime.GOOS+"/"+runtime.GOARCH {
		t.Errorf("got %+v; want version v1.2.3-test, %s, %s/%s", got, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	}
}

func TestVersionYAMLAndTable(t *testing.T) {
	stampVersion(t, "v9.8.7")
	out, err := runImagectl(t, "version", "-o", "yaml")
	if err != nil {
		t.Fatalf("imagectl version -o yaml: %v", err)
	}
	var got api.VersionInfo
	if err := yaml.UnmarshalStrict([]byte(out), &got); err != nil || got.Version != "v9.8.7" || got.Platform != runtime.GOOS+"/"+runtime.GOARCH {
		t.Errorf("yaml %q: %+v, %v", out, got, err)
	}

	out, err = runImagectl(t, "version")
	if err != nil {
		t.Fatalf("imagectl version: %v", err)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	labels := []string{"Version:", "Commit:", "Go:", "Platform:"}
	if len(lines) != len(labels) {
		t.Fatalf("table has %d lines, want %d:\n%s", len(lines), len(labels), out)
	}
	values := []string{"v9.8.7", "", runtime.Version(), runtime.GOOS + "/" + runtime.GOARCH}
	for i, l := range lines {
		f := strings.Fields(l)
		if len(f) < 2 || f[0] != labels[i] || (values[i] != "" && f[1] != values[i]) {
			t.Errorf("line %d is %q; want %s %s", i+1, l, labels[i], values[i])
		}
	}

	out, err = runImagectl(t, "--version")
	if err != nil || !strings.Contains(out, "v9.8.7 (commit ") {
		t.Errorf("imagectl --version: %q, %v; want the one-line form with v9.8.7", out, err)
	}
}

func TestVersionRefusesBadUse(t *testing.T) {
	for _, args := range [][]string{{"version", "-o", "xml"}, {"version", "extra"}} {
		if out, err := runImagectl(t, args...); err == nil || describe(err).ExitCode != exitError {
			t.Errorf("imagectl %s: output %q, error %v; want exit 1", strings.Join(args, " "), out, err)
		}
	}
}
