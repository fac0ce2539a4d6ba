package cli

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// TestReferencesOutsideTheGrammarSendNothing runs every command that takes
// a registry reference with references outside the OCI grammar, against a
// real registry behind a proxy that counts bytes: each exits 1 with a
// sentence naming the part and the rule, and not one byte reaches the
// registry. "acme/../globex" is the tenant escape go-containerregistry
// lets through (its URL joining then cleans the path into globex/evil).
func TestReferencesOutsideTheGrammarSendNothing(t *testing.T) {
	reg := harness.StartRegistry(t, harness.RegistryOptions{})
	proxy := harness.StartCutProxy(t, reg.Host)
	host := proxy.Addr
	dir := t.TempDir()
	disk := filepath.Join(dir, "disk.raw")
	if err := os.WriteFile(disk, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	tmpl := filepath.Join(dir, "simple_vm.json")
	if err := os.WriteFile(tmpl, []byte(`{"id":"simple_vm","title":"Simple VM","parameters":[{"name":"vm_cpu_cores","default":{"value":2}}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out.raw")
	const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

	bad := []struct {
		ref  string
		says string
	}{
		{host + "/acme/../globex/evil:1", `path component ".." of the repository is a relative path step`},
		{host + "/acme/./evil:1", `path component "." of the repository`},
		{host + "/acme//evil:1", "empty path component"},
		{host + "/acme/Evil:1", "upper-case letters"},
		{host + "/acme/a..b:1", "OCI name grammar"},
		{host + "/acme/evil:-1", "tag \"-1\""},
		{host + "/acme/evil:" + strings.Repeat("x", 129), "the limit is 128"},
		{host + "/evil:1", "has no tenant"},
		{host + "/Acme/evil:1", "upper-case letters"},
		{"acme/evil:1", "no registry host"},
		{host + "/acme/evil", "imagectl never assumes :latest"},
		{host + "/acme/evil@sha256:00", "64 lower-case hexadecimal digits"},
		{host + "/acme/evil:1@" + digest, "both a tag and a digest"},
		{strings.Replace(host, ":", ":0", 1) + "/acme/evil:1", "without leading zeros"},
		{"REG.EXAMPLE.COM/acme/evil:1", "write the host in lower case"},
	}
	run := func(t *testing.T, args []string, says string) {
		t.Helper()
		before := proxy.Forwarded()
		r := testenv.RunCommand(t, testenv.Command{Name: testenv.Imagectl, Args: args, Env: []string{"IMAGEPIPE_CACHE=" + t.TempDir()}})
		if r.Code != 1 || !strings.Contains(r.Stderr, "invalid image reference") || !strings.Contains(r.Stderr, says) {
			t.Errorf("imagectl %s: exit %d, stderr %q; want 1 and %q", strings.Join(args, " "), r.Code, r.Stderr, says)
		}
		if sent := proxy.Forwarded() - before; sent != 0 {
			t.Errorf("imagectl %s sent %d bytes to the registry", strings.Join(args, " "), sent)
		}
	}
	for _, b := range bad {
		t.Run(b.ref, func(t *testing.T) {
			run(t, []string{"import", "--quiet", disk, b.ref}, b.says)
			run(t, []string{"export", b.ref, out}, b.says)
			run(t, []string{"delete", b.ref}, b.says)
			run(t, []string{"inspect", "docker://" + b.ref}, b.says)
			run(t, []string{"copy", b.ref, host + "/acme/dst:1"}, b.says)
			run(t, []string{"copy", host + "/acme/src:1", b.ref}, b.says)
		})
	}
	// Commands with their own forms: a digest where import writes a tag,
	// a tenant with more than a tenant, a catalog and a template ID
	// outside the grammar.
	run(t, []string{"import", "--quiet", disk, host + "/acme/evil@" + digest}, "writes a tag")
	run(t, []string{"list", host + "/acme/../globex"}, "relative path step")
	run(t, []string{"list", host + "/a_b"}, "not a valid name")
	run(t, []string{"template", "list", "--catalog", host + "/../catalog"}, "relative path step")
	run(t, []string{"template", "publish", tmpl, "--catalog", host + "/Catalog"}, "upper-case")
	run(t, []string{"template", "show", "../x", "--catalog", host + "/catalog"}, `template ID "../x" is not a tag`)
	run(t, []string{"template", "show", digest, "--catalog", host + "/catalog"}, "is not a tag")
	run(t, []string{"template", "delete", "../x", "--catalog", host + "/catalog"}, `template ID "../x" is not a tag`)
	// The escape did not happen: globex has nothing.
	resp, err := http.Get("http://" + reg.Host + "/v2/globex/evil/tags/list")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("globex/evil: HTTP %d, want 404", resp.StatusCode)
	}
}
