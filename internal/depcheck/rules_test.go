package depcheck

import (
	"bytes"
	"encoding/json"
	"errors"
	"go/parser"
	"go/token"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/imagepipe/imagepipe/"

// rule forbids the packages under pkg (pkg itself and, when pkg ends in
// "/...", every package below it) to depend on any import path starting
// with one of the prefixes in forbid, directly or transitively.
type rule struct {
	pkg    string
	why    string
	forbid []string
}

// kubernetes is every import path prefix of the Kubernetes and KubeVirt stacks.
var kubernetes = []string{"k8s.io/", "sigs.k8s.io/", "kubevirt.io/"}

// clusterAPIs are the Kubernetes clients and API types (klog alone, which
// sigstore-go's transparency-log code logs through, is no cluster).
var clusterAPIs = []string{"k8s.io/client-go", "k8s.io/api/", "k8s.io/apimachinery", "sigs.k8s.io/", "kubevirt.io/"}

// network is every standard package that opens connections.
var network = []string{"net", "crypto/tls"}

// controllerStack is what only the syncer's daemon needs.
var controllerStack = []string{"sigs.k8s.io/controller-runtime", "github.com/prometheus/"}

// protocol is the OCI distribution protocol: internal/registry speaks it,
// and internal/catalog through the oras-go client internal/registry opens.
var protocol = []string{"github.com/google/go-containerregistry/pkg/v1/remote", "oras.land/oras-go/v2/registry/remote"}

func internal(names ...string) []string {
	var out []string
	for _, n := range names {
		out = append(out, module+"internal/"+n)
	}
	return out
}

// internalBut is every internal package but the named ones (the test
// runs in internal/depcheck, so ".." is internal/).
func internalBut(names ...string) []string {
	dirs, err := os.ReadDir("..")
	if err != nil {
		panic(err)
	}
	var out []string
	for _, d := range dirs {
		if d.IsDir() && !slices.Contains(names, d.Name()) {
			out = append(out, module+"internal/"+d.Name())
		}
	}
	return out
}

func join(lists ...[]string) []string { return slices.Concat(lists...) }

var rules = []rule{
	{"internal/convert", "the disk engine is pure: bytes in, bytes out (no network, Kubernetes, pkg/api or internal package but the rejection taxonomy)",
		join(network, kubernetes, []string{module + "pkg/"},
			internal("cachefile", "cdi", "containerdisk", "hub", "intake", "kube", "registry", "source", "vmlaunch"))},
	{"internal/reject", "the rejection taxonomy is a leaf the disk engine can use",
		[]string{module}},
	{"internal/containerdisk", "the containerDisk format knows no network, registry or cluster",
		join(network, kubernetes, internal("registry", "source", "cdi", "hub", "intake", "vmlaunch"))},
	{"internal/source", "sources read bytes; they know no registry and no cluster",
		join(kubernetes, protocol, internal("registry", "containerdisk", "cdi", "hub", "intake", "vmlaunch"))},
	{"internal/registry", "the registry package speaks the OCI protocol and knows no Kubernetes",
		join(kubernetes, internal("source", "cdi", "hub", "intake", "vmlaunch"))},
	{"internal/registry", "the registry package speaks the protocol only: it knows no disk and no containerDisk, so that a hub links no disk engine",
		internal("convert", "containerdisk", "publish")},
	{"cmd/image-syncer", "a hub never reads a disk: image-syncer links no disk engine and no containerDisk format",
		internal("convert", "containerdisk", "publish")},
	{"internal/publish", "pushing containerDisks knows no cluster and no disk source",
		join(kubernetes, internal("source", "cdi", "hub", "intake", "vmlaunch", "gate"))},
	{"internal/diskimage", "reading a containerDisk back knows no cluster, no disk source and no verification",
		join(kubernetes, internal("source", "cdi", "hub", "intake", "vmlaunch", "gate"))},
	{"internal/catalog", "the template catalog knows no cluster and no disk source",
		join(kubernetes, internal("source", "cdi", "hub", "intake", "vmlaunch"))},
	{"internal/intake", "intake turns notifications into events without the controller stack",
		join(controllerStack, internal("hub", "cdi", "vmlaunch"))},
	{"internal/daemon", "both daemons link their shared runtime, and image-gate links no controller stack and neither links the other's work",
		join(controllerStack, internal("hub", "gate", "netsync", "cdi", "vmlaunch"))},
	{"internal/cdi", "cdi is CDI vocabulary only, which imagectl links too",
		join(controllerStack, protocol, internal("hub", "intake", "registry", "vmlaunch"))},
	{"internal/hub", "the hub replicates images; it never launches VMs",
		internal("vmlaunch")},
	{"internal/vmlaunch", "vmlaunch builds VMs; it never reconciles images",
		join(protocol, internal("hub", "intake", "registry"))},
	{"internal/vmlaunch", "imagectl links vmlaunch, and imagectl links no controller stack",
		controllerStack},
	{"internal/kube", "imagectl's Kubernetes client is client-go only",
		join(controllerStack, internal("hub", "intake", "vmlaunch", "cdi"))},
	{"pkg/...", "pkg/api is public data types and imports nothing internal",
		[]string{module + "internal/", module + "cmd/"}},
	{"cmd/imagectl", "the tenant CLI links no controller-runtime and no Prometheus client",
		controllerStack},
	{"cmd/imagectl", "the tenant CLI does not carry the hub's code",
		internal("hub", "intake", "netsync")},
	{"internal/tenantnet", "the networks' vocabulary is shared with imagectl: no controller stack, no registry, no other internal package but the tenant grammar",
		join(controllerStack, protocol, internalBut("imageref"))},
	{"internal/netsync", "provisioning networks touches no images, registry or VMs",
		join(protocol, internal("hub", "intake", "registry", "vmlaunch", "gate", "convert"))},
	{"cmd/image-syncer", "the syncer never launches VMs",
		internal("vmlaunch")},
	{"internal/attest", "signing knows no registry and no cluster, and links no sigstore-go (imagectl links attest)",
		join(clusterAPIs, protocol, []string{"github.com/sigstore/"}, internal("registry", "hub", "intake", "gate", "verdict", "trust", "vmlaunch"))},
	{"internal/trust", "trusting a bundle knows no registry and no cluster",
		join(clusterAPIs, protocol, internal("registry", "hub", "intake", "gate", "verdict", "vmlaunch"))},
	{"cmd/imagectl", "the tenant CLI links no sigstore-go: its start-up alone costs 17 MiB of memory",
		[]string{"github.com/sigstore/"}},
	{"internal/verdict", "imagectl reads verdicts too: no cluster, no controller stack, no sigstore-go",
		join(clusterAPIs, controllerStack, []string{"github.com/sigstore/"}, internal("hub", "gate", "intake", "trust", "vmlaunch"))},
	{"internal/gate", "the gate verifies images; it knows no hub, no VM and no controller-runtime",
		join([]string{"sigs.k8s.io/controller-runtime"}, internal("hub", "cdi", "vmlaunch"))},
	{"internal/guest", "reading a guest disk is a leaf: no registry, cluster or other internal package, only pkg/api's report (its ext4 reader's logger, zap, links net/http; nothing here opens a connection)",
		join(kubernetes, protocol, []string{module + "internal/"})},
	{"internal/ocidoc", "the strict document reader is a small leaf, so that fuzzing it compiles little",
		join(network, kubernetes, protocol, internal("registry", "gate", "convert", "containerdisk"))},
	{"cmd/image-gate", "the gate links no controller-runtime and no hub code",
		join([]string{"sigs.k8s.io/controller-runtime"}, internal("hub", "cdi", "vmlaunch"))},
}

// pkgInfo is the part of `go list -json` the rules read.
type pkgInfo struct {
	ImportPath string
	Doc        string
	Imports    []string
	Dir        string
	GoFiles    []string
	CgoFiles   []string
}

// graph is every package of the module and everything they import.
type graph struct {
	module []pkgInfo          // the module's own packages, test-only ones included
	all    map[string]pkgInfo // every package by import path
}

// violation walks the imports of from breadth first and returns the
// shortest import chain that reaches a package the rule forbids.
func (g graph) violation(from string, r rule) (string, bool) {
	prev := map[string]string{from: ""}
	queue := []string{from}
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		if cur != from && r.forbids(cur) {
			var path []string
			for p := cur; p != ""; p = prev[p] {
				path = append(path, strings.TrimPrefix(p, module))
			}
			slices.Reverse(path)
			return strings.Join(path, " -> "), true
		}
		for _, next := range g.all[cur].Imports {
			if _, seen := prev[next]; !seen {
				prev[next] = cur
				queue = append(queue, next)
			}
		}
	}
	return "", false
}

// listModule lists the module's packages and their dependencies.
func listModule(t *testing.T) graph {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Fatalf("the go command is needed to list packages: %v", err)
	}
	cmd := exec.Command("go", "list", "-deps", "-json=ImportPath,Doc,Imports,Dir,GoFiles,CgoFiles", module+"...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	g := graph{all: map[string]pkgInfo{}}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkgInfo
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decoding go list output: %v", err)
		}
		g.all[p.ImportPath] = p
		if strings.HasPrefix(p.ImportPath, module) {
			g.module = append(g.module, p)
		}
	}
	if len(g.module) < 10 {
		t.Fatalf("go list found only %d packages; is the test run inside the module?", len(g.module))
	}
	return g
}

func (r rule) applies(importPath string) bool {
	rel := strings.TrimPrefix(importPath, module)
	if base, ok := strings.CutSuffix(r.pkg, "/..."); ok {
		return rel == base || strings.HasPrefix(rel, base+"/")
	}
	return rel == r.pkg
}

// forbids reports whether the rule forbids depending on the package dep.
// A prefix ending in "/" matches below it ("k8s.io/"); any other matches
// itself and the packages below it ("net" matches net/http, not netip).
func (r rule) forbids(dep string) bool {
	for _, f := range r.forbid {
		if dep == f || strings.HasPrefix(dep, strings.TrimSuffix(f, "/")+"/") {
			return true
		}
	}
	return false
}

func TestPackageRules(t *testing.T) {
	g := listModule(t)
	for _, r := range rules {
		t.Run(r.pkg, func(t *testing.T) {
			matched := 0
			for _, p := range g.module {
				if !r.applies(p.ImportPath) {
					continue
				}
				matched++
				if chain, bad := g.violation(p.ImportPath, r); bad {
					t.Errorf("%s, but %s", chain, r.why)
					break
				}
			}
			if matched == 0 {
				t.Errorf("rule for %s matches no package; update the rule when a package moves", r.pkg)
			}
		})
	}
}

func TestEveryPackageSaysItsJob(t *testing.T) {
	for _, p := range listModule(t).module {
		if strings.TrimSpace(p.Doc) == "" {
			t.Errorf("%s has no package doc comment: add a doc.go whose first sentence says its job", p.ImportPath)
		}
	}
}

// maxDocLines is the longest a package doc comment may be, in lines: a
// screen, which states the contract; the design behind it goes to docs/.
const maxDocLines = 25

func TestPackageDocsFitAScreen(t *testing.T) {
	for _, p := range listModule(t).module {
		for _, name := range slices.Concat(p.GoFiles, p.CgoFiles) {
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, parser.PackageClauseOnly|parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			if f.Doc == nil {
				continue
			}
			if n := fset.Position(f.Doc.End()).Line - fset.Position(f.Doc.Pos()).Line + 1; n > maxDocLines {
				t.Errorf("%s: the package doc comment is %d lines, more than a screen (%d): keep the contract, move the design to docs/", filepath.Join(p.ImportPath, name), n, maxDocLines)
			}
		}
	}
}

// TestRulesCatchAViolation checks the matcher itself on known answers, so a
// broken matcher cannot make every rule pass.
func TestRulesCatchAViolation(t *testing.T) {
	r := rule{pkg: "internal/convert", forbid: join(network, kubernetes, []string{module + "pkg/api"})}
	for dep, want := range map[string]bool{
		"net":                    true,
		"net/http":               true,
		"netip":                  false,
		"k8s.io/client-go/rest":  true,
		"sigs.k8s.io/yaml":       true,
		module + "pkg/api":       true,
		module + "pkg/api/v1":    true,
		module + "pkg/apiextra":  false,
		"github.com/klauspost/x": false,
		"crypto/tls":             true,
		"crypto/sha256":          false,
	} {
		if got := r.forbids(dep); got != want {
			t.Errorf("forbidden(%q) = %v, want %v", dep, got, want)
		}
	}
	if !(rule{pkg: "pkg/..."}).applies(module+"pkg/api/v1alpha1") || (rule{pkg: "internal/cdi"}).applies(module+"internal/cdix") {
		t.Error("applies matches the wrong packages")
	}
}
