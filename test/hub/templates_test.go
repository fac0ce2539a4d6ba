package hub

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/imagepipe/imagepipe/internal/cdi"
	"github.com/imagepipe/imagepipe/internal/kube"
	"github.com/imagepipe/imagepipe/internal/vmlaunch"
	"github.com/imagepipe/imagepipe/pkg/api"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// sampleTemplates is the repository's templates/ directory.
func sampleTemplates(t *testing.T) string { return filepath.Join(harness.RepoRoot(t), "templates") }

// registryTags lists repo's tags with a plain GET of the distribution API,
// independently of imagectl.
func registryTags(t *testing.T, host, repo string) []string {
	t.Helper()
	resp, err := http.Get("http://" + host + "/v2/" + repo + "/tags/list")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		Tags []string `json:"tags"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	slices.Sort(list.Tags)
	return list.Tags
}

// publishedIDs returns the IDs template list -o json shows.
func publishedIDs(t *testing.T, catalog ...string) []string {
	t.Helper()
	var list []api.TemplateSummary
	if err := json.Unmarshal([]byte(testenv.RunImagectlOK(t, append([]string{"template", "list", "-o", "json"}, catalog...)...).Stdout), &list); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, s := range list {
		ids = append(ids, s.ID)
	}
	return ids
}

// TestTemplateDeleteLeavesNoDanglingTag publishes the sample templates to
// the real distribution registry and deletes one: its tag is gone from the
// registry's own tag list, template list and show no longer find it, and
// the other templates stay. A second delete, an ID never published, a tag
// that is not a template, and a template whose manifest another tag also
// names are refused, each leaving the catalog as it was. Template IDs
// complete from the catalog (--catalog or $IMAGEPIPE_CATALOG) for template
// show and delete and vm create --template.
func TestTemplateDeleteLeavesNoDanglingTag(t *testing.T) {
	t.Parallel()
	reg := harness.StartRegistry(t, harness.RegistryOptions{})
	catalog := []string{"--catalog", reg.Host}
	testenv.RunImagectlOK(t, append([]string{"template", "publish", sampleTemplates(t)}, catalog...)...)
	all := []string{"gpu_workstation", "linux_server", "simple_vm", "windows_server"}
	if got := publishedIDs(t, catalog...); !slices.Equal(got, all) {
		t.Fatalf("published %v, want %v", got, all)
	}

	// Completion, before anything is deleted.
	env := []string{"IMAGEPIPE_CATALOG=" + reg.Host}
	for _, tc := range []struct {
		env  []string
		args []string
		want []string
	}{
		{nil, []string{"template", "show", "--catalog", reg.Host, ""}, all},
		{env, []string{"template", "delete", "wi"}, []string{"windows_server"}},
		{env, []string{"template", "delete", "windows_server", ""}, nil},
		{env, []string{"vm", "create", "web", "--template", "s"}, []string{"simple_vm"}},
	} {
		got, directive := complete(t, tc.env, tc.args...)
		if !slices.Equal(got, tc.want) || directive != ":4" {
			t.Errorf("completing imagectl %s: %q %s, want %q :4", strings.Join(tc.args, " "), got, directive, tc.want)
		}
	}

	r := testenv.RunImagectlOK(t, append([]string{"template", "delete", "windows_server"}, catalog...)...)
	if !strings.HasPrefix(r.Stdout, "template windows_server deleted from "+reg.Host+"/templates (") {
		t.Errorf("template delete printed %q", r.Stdout)
	}
	rest := []string{"gpu_workstation", "linux_server", "simple_vm"}
	if got := registryTags(t, reg.Host, "templates"); !slices.Equal(got, rest) {
		t.Errorf("the registry's tag list after the delete: %v, want %v", got, rest)
	}
	if got := publishedIDs(t, catalog...); !slices.Equal(got, rest) {
		t.Errorf("template list after the delete: %v, want %v", got, rest)
	}
	for _, args := range [][]string{{"template", "show", "windows_server"}, {"template", "delete", "windows_server"}, {"template", "delete", "no_such_template"}} {
		r := testenv.RunImagectl(t, append(args, catalog...)...)
		if r.Code != 1 || !strings.Contains(r.Stderr, "has no template \""+args[2]+"\"") || !strings.Contains(r.Stderr, "imagectl template list") {
			t.Errorf("imagectl %s: exit %d\n%s", strings.Join(args, " "), r.Code, r.Stderr)
		}
	}

	// A tag in the catalog repository that is not a template.
	img, err := random.Image(512, 1)
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := name.ParseReference(reg.Host + "/templates:notatemplate")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(foreign, img); err != nil {
		t.Fatal(err)
	}
	if r := testenv.RunImagectl(t, append([]string{"template", "delete", "notatemplate"}, catalog...)...); r.Code != 1 || !strings.Contains(r.Stderr, "is not a template") {
		t.Errorf("deleting a tag that is not a template: exit %d\n%s", r.Code, r.Stderr)
	}
	// An alias made by another client (crane tag: the same manifest under a second tag).
	testenv.Run(t, harness.Binary(t, "crane"), "tag", "--insecure", reg.Host+"/templates:linux_server", "linux")
	r = testenv.RunImagectl(t, append([]string{"template", "delete", "linux_server"}, catalog...)...)
	if r.Code != 1 || !strings.Contains(r.Stderr, "also tagged linux, which the registry would remove with it") {
		t.Errorf("deleting a template with an alias: exit %d\n%s", r.Code, r.Stderr)
	}
	want := []string{"gpu_workstation", "linux", "linux_server", "notatemplate", "simple_vm"}
	if got := registryTags(t, reg.Host, "templates"); !slices.Equal(got, want) {
		t.Errorf("the refusals changed the catalog: tags %v, want %v", got, want)
	}
	// template list skips the tag that is not a template and lists the alias as the template it is.
	if got := publishedIDs(t, catalog...); !slices.Equal(got, []string{"gpu_workstation", "linux_server", "linux_server", "simple_vm"}) {
		t.Errorf("template list with an alias and a foreign tag: %v", got)
	}
}

// TestSampleTemplatesPublishAndPassKubeVirtAdmission publishes templates/
// to the real registry, reads every template back as a tenant does
// (template show -o json), renders a VM from it with its defaults as vm
// create does, against the KubeVirt configuration of the hub, and creates
// it on a hub whose VirtualMachines go through KubeVirt v1.8.0's own
// admission (an OpenShift Virtualization configuration permitting the
// sample's GPUs): each is admitted with what imagectl meant kept, starts
// and stops, can be launched, and KubeVirt's live-migration verdict on its
// instance is the one imagectl recorded (checkThroughKubeVirt) — except
// for the Windows sample, whose preference KubeVirt migrates only on nodes
// that expose their TSC frequency, which imagectl notes.
func TestSampleTemplatesPublishAndPassKubeVirtAdmission(t *testing.T) {
	t.Parallel()
	reg := harness.StartRegistry(t, harness.RegistryOptions{})
	catalog := []string{"--catalog", reg.Host}
	var published []api.PublishResult
	out := testenv.RunImagectlOK(t, append([]string{"template", "publish", sampleTemplates(t), "-o", "json"}, catalog...)...).Stdout
	if err := json.Unmarshal([]byte(out), &published); err != nil {
		t.Fatal(err)
	}
	if len(published) != 4 {
		t.Fatalf("published %+v, want the 4 samples", published)
	}

	cr := harness.OpenShiftVirtualizationCR()
	cr.Spec.Configuration.PermittedHostDevices = &kubevirtv1.PermittedHostDevices{PciHostDevices: []kubevirtv1.PciHostDevice{
		{PCIVendorSelector: "10DE:2236", ResourceName: "nvidia.com/GA102GL_A10"},
		{PCIVendorSelector: "10DE:1EB8", ResourceName: "nvidia.com/TU104GL_Tesla_T4"},
	}}
	hub := harness.StartHub(t, "hub-samples")
	adm := hub.StartKubeVirtAdmission(t, cr)
	kc, err := kube.New(hub.RestConfig, harness.NewScheme(t))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := vmlaunch.ReadKubeVirtConfig(t.Context(), kc)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range published {
		t.Run(p.ID, func(t *testing.T) {
			shown := testenv.RunImagectlOK(t, append([]string{"template", "show", p.ID, "-o", "json"}, catalog...)...).Stdout
			tmpl, err := vmlaunch.ParseTemplate([]byte(shown))
			if err != nil {
				t.Fatalf("template show -o json of %s does not parse back: %v", p.ID, err)
			}
			values, err := vmlaunch.ResolveParameters(tmpl, nil)
			if err != nil {
				t.Fatal(err)
			}
			ns := strings.ReplaceAll(p.ID, "_", "-")
			r, err := vmlaunch.Render(vmlaunch.Request{
				Name: "vm1", Namespace: ns, Template: tmpl, Values: values, KubeVirt: kv,
				Image: vmlaunch.Image{Tenant: "acme", Name: "os", Tag: "1", Namespace: ns, DataSource: "os--1",
					Digest: "sha256:" + strings.Repeat("0f", 32), VirtualSize: 10 << 30},
				Storage: cdi.Storage{StorageClass: "shared", AccessMode: corev1.ReadWriteMany, VolumeMode: corev1.PersistentVolumeBlock},
			})
			if err != nil {
				t.Fatalf("rendering %s: %v", p.ID, err)
			}
			notes := strings.Join(append(r.Notes, vmlaunch.PreferenceNotes(t.Context(), kc, r)...), "; ")
			t.Logf("imagectl's notes: %s", notes)
			want := kubeVirtVerdict{}
			if p.ID == "windows_server" {
				// KubeVirt's Windows preferences enable Hyper-V reenlightenment, which KubeVirt
				// migrates only where nodes expose their TSC frequency; this hub has no nodes.
				// imagectl cannot know the nodes and says so in a note.
				want.notMigratable = "HyperV Reenlightenment VMIs cannot migrate when TSC Frequency is not exposed"
				if !strings.Contains(notes, "preference windows.2k22.virtio enables Hyper-V reenlightenment") {
					t.Errorf("imagectl's notes do not warn about reenlightenment: %q", notes)
				}
			}
			g := goldenVM{name: ns}
			g.doc.VM, g.doc.Secrets, g.doc.LiveMigratable, g.doc.Reasons = r.VM, r.Secrets, r.LiveMigratable, r.Reasons
			checkThroughKubeVirt(t, adm, kc, g, want)
		})
	}
}
