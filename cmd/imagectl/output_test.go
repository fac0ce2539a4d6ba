package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/imagepipe/imagepipe/pkg/api"
)

// run is one in-process run of imagectl, ended as main ends it.
type run struct {
	stdout string
	code   int
	err    error
}

// runReported runs imagectl with args in-process and reports the outcome
// as main does (report): the exit code, and the error object on standard
// output under -o json or yaml. The message report writes to the
// process's standard error is not captured.
func runReported(t *testing.T, args ...string) run {
	t.Helper()
	root := newRootCmd()
	var stdout, stderr bytes.Buffer
	root.SetOut(&stdout)
	root.SetErr(&stderr)
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(t.Context())
	code := report(cmd, err)
	return run{stdout: stdout.String(), code: code, err: err}
}

// startRegistry serves go-containerregistry's in-memory registry on
// 127.0.0.1, which imagectl reaches over plain HTTP, and returns its host.
func startRegistry(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// decodeFailure decodes the one error object a failing command printed
// under -o json or yaml, refusing anything else on standard output.
func decodeFailure(t *testing.T, format string, r run) api.FailureDetail {
	t.Helper()
	data := []byte(r.stdout)
	if format == "yaml" {
		var err error
		if data, err = yaml.YAMLToJSON(data); err != nil {
			t.Fatalf("-o yaml: standard output is not YAML: %v\n%s", err, r.stdout)
		}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var f api.Failure
	if err := dec.Decode(&f); err != nil {
		t.Fatalf("-o %s: standard output of a failing command is not an error object: %v\n%s", format, err, r.stdout)
	}
	if dec.More() {
		t.Fatalf("-o %s: more than the error object on standard output:\n%s", format, r.stdout)
	}
	if f.Error.ExitCode != r.code || f.Error.Code == "" || f.Error.Message == "" {
		t.Errorf("-o %s: error object %+v for exit code %d; want the code, the message and the exit code", format, f.Error, r.code)
	}
	return f.Error
}

// commandsWithoutOutput are the commands that print no data, only text
// for a shell or a person, and so have no -o.
var commandsWithoutOutput = map[string]string{
	"imagectl completion bash":       "prints a shell script",
	"imagectl completion fish":       "prints a shell script",
	"imagectl completion powershell": "prints a shell script",
	"imagectl completion zsh":        "prints a shell script",
	"imagectl help":                  "prints help",
	"imagectl vm console":            "connects a terminal to a serial port",
}

// leafCommands are the commands of the tree that do something: not the
// groups, not cobra's hidden ones.
func leafCommands(root *cobra.Command) []*cobra.Command {
	var out []*cobra.Command
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			if !sub.Hidden {
				walk(sub)
			}
		}
		if !c.HasSubCommands() && c.Runnable() {
			out = append(out, c)
		}
	}
	walk(root)
	return out
}

// TestEveryCommandThatPrintsDataSpeaksJSON walks the command tree: every
// command but those that print only text for a shell or a person has -o,
// offering json and yaml; each, run with -o json and then -o yaml on
// input that fails past the flag checks (a file, registry repository,
// template or kubeconfig that does not exist), prints exactly one error
// object on standard output whose code is not "usage" (the format was
// accepted and the command went to work) and whose exit code is the
// process's; one that succeeds prints valid JSON. A format a command does
// not offer is a usage error, with nothing on standard output.
func TestEveryCommandThatPrintsDataSpeaksJSON(t *testing.T) {
	t.Setenv("IMAGEPIPE_CACHE", t.TempDir())
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	reg := startRegistry(t)
	dir := t.TempDir()
	kube := []string{"--kubeconfig", filepath.Join(dir, "no-kubeconfig"), "-n", "acme"}
	missing := filepath.Join(dir, "missing.qcow2")
	cases := map[string][]string{
		"inspect":           {missing},
		"convert":           {missing, filepath.Join(dir, "out.qcow2")},
		"import":            {missing, reg + "/acme/disk:1"},
		"list":              {reg + "/acme/disk"},
		"export":            {reg + "/acme/disk:1", filepath.Join(dir, "out.qcow2")},
		"delete":            {reg + "/acme/disk:1"},
		"copy":              {reg + "/acme/disk:1", reg + "/acme/disk:2"},
		"sign":              {reg + "/acme/disk:1", "--key", filepath.Join(dir, "no.key")},
		"version":           {},
		"login":             {reg, "--username", "alice", "--password-stdin"},
		"logout":            {reg},
		"template publish":  {filepath.Join(dir, "no-templates"), "--catalog", reg},
		"template list":     {"--catalog", reg},
		"template show":     {"simple_vm", "--catalog", reg},
		"template delete":   {"simple_vm", "--catalog", reg},
		"vm create":         append([]string{"web", "--image", "acme/rhel:9", "--template-file", filepath.Join(dir, "no-template.yaml")}, kube...),
		"vm list":           kube,
		"vm get":            append([]string{"web"}, kube...),
		"vm start":          append([]string{"web"}, kube...),
		"vm stop":           append([]string{"web"}, kube...),
		"vm restart":        append([]string{"web"}, kube...),
		"vm delete":         append([]string{"web"}, kube...),
		"vm migrate":        append([]string{"web"}, kube...),
		"vm update":         append([]string{"web", "--set", "vm_memory=4Gi"}, kube...),
		"vm attach-volume":  append([]string{"web", "data1"}, kube...),
		"vm detach-volume":  append([]string{"web", "data1"}, kube...),
		"vm expose":         append([]string{"web", "--port", "80"}, kube...),
		"vm unexpose":       append([]string{"web"}, kube...),
		"volume create":     append([]string{"data1", "--size", "1Gi"}, kube...),
		"volume list":       kube,
		"volume delete":     append([]string{"data1"}, kube...),
		"network create":    append([]string{"front", "--subnet", "10.10.0.0/24"}, kube...),
		"network list":      kube,
		"network get":       append([]string{"front"}, kube...),
		"network delete":    append([]string{"front"}, kube...),
		"loadbalancer list": kube,
		"loadbalancer get":  append([]string{"web"}, kube...),
		"status":            {"acme/rhel:9", "--kubeconfig", filepath.Join(dir, "no-kubeconfig")},
	}
	seen := 0
	for _, c := range leafCommands(newRootCmd()) {
		path := c.CommandPath()
		if reason, ok := commandsWithoutOutput[path]; ok {
			if c.Flags().Lookup("output") != nil {
				t.Errorf("%s has -o, but is listed as a command that %s", path, reason)
			}
			continue
		}
		seen++
		o := c.Flags().Lookup("output")
		if o == nil || o.Shorthand != "o" {
			t.Errorf("%s prints data but has no -o/--output", path)
			continue
		}
		if !strings.Contains(o.Usage, "json") || !strings.Contains(o.Usage, "yaml") {
			t.Errorf("%s -o offers %q; want json and yaml among them", path, o.Usage)
		}
		name := strings.TrimPrefix(path, "imagectl ")
		args, ok := cases[name]
		if !ok {
			t.Errorf("%s: add a case to this test (arguments that get past the flag checks)", path)
			continue
		}
		argv := append(strings.Fields(name), args...)
		t.Run(name, func(t *testing.T) {
			for _, format := range []string{"json", "yaml"} {
				r := runReported(t, append(argv, "-o", format)...)
				if r.code == 0 {
					if format == "json" && !json.Valid([]byte(r.stdout)) {
						t.Errorf("-o json printed invalid JSON:\n%s", r.stdout)
					}
					continue
				}
				if f := decodeFailure(t, format, r); f.Code == "usage" {
					t.Errorf("-o %s: a usage error (%s); the arguments of this test should get past the flag checks", format, f.Message)
				}
			}
			r := runReported(t, append(argv, "-o", "bogus")...)
			var usage *usageError
			if r.code != exitError || !errors.As(r.err, &usage) || r.stdout != "" || !strings.Contains(r.err.Error(), `unknown output format "bogus"`) {
				t.Errorf("-o bogus: exit %d, error %v, stdout %q; want exit 1, a usage error naming the format, nothing on standard output", r.code, r.err, r.stdout)
			}
		})
	}
	if seen < 25 {
		t.Errorf("the walk found %d commands with data to print; the tree has more", seen)
	}
}

// TestFailureCodesUnderJSON: a failing command under -o json says why in
// its error object's code: a command line it cannot run is "usage", a
// template the catalog does not hold is "not-found".
func TestFailureCodesUnderJSON(t *testing.T) {
	t.Setenv("IMAGEPIPE_CACHE", t.TempDir())
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	t.Setenv("IMAGEPIPE_CATALOG", "")
	reg := startRegistry(t)
	kube := []string{"--kubeconfig", filepath.Join(t.TempDir(), "no-kubeconfig"), "-n", "acme"}
	for _, tc := range []struct {
		args []string
		code string
		say  string
	}{
		{append([]string{"vm", "create", "web", "--template", "simple_vm"}, kube...), "usage", "name the image with --image"},
		{append([]string{"vm", "create", "web", "--image", "acme/rhel:9", "--template", "a", "--template-file", "b"}, kube...), "usage", "name one template"},
		{append([]string{"vm", "create", "web", "--image", "acme/rhel:9", "--template", "a", "--timeout", "1m"}, kube...), "usage", "--timeout bounds --wait"},
		{append([]string{"volume", "create", "data1", "--size", "lots"}, kube...), "usage", `--size "lots": want a quantity`},
		{append([]string{"vm", "get"}, kube...), "usage", "accepts 1 arg(s)"},
		{[]string{"template", "list"}, "usage", "name the template catalog with --catalog"},
		{[]string{"template", "show", "simple_vm", "--catalog", reg}, "not-found", `has no template "simple_vm"`},
		{[]string{"template", "delete", "simple_vm", "--catalog", reg}, "not-found", `has no template "simple_vm"`},
	} {
		r := runReported(t, append(tc.args, "-o", "json")...)
		if r.code != exitError {
			t.Errorf("imagectl %s -o json: exit %d, want 1", strings.Join(tc.args, " "), r.code)
			continue
		}
		f := decodeFailure(t, "json", r)
		if f.Code != tc.code || !strings.Contains(f.Message, tc.say) {
			t.Errorf("imagectl %s -o json: %+v; want code %q and %q", strings.Join(tc.args, " "), f, tc.code, tc.say)
		}
	}
}
