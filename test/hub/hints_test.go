package hub

import (
	"errors"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/imagepipe/imagepipe/internal/cdi"
	"github.com/imagepipe/imagepipe/internal/hub"
	"github.com/imagepipe/imagepipe/pkg/api"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
	"github.com/imagepipe/imagepipe/test/testenv"
)

const (
	preferenceLabel     = "instancetype.kubevirt.io/default-preference"
	preferenceKindLabel = "instancetype.kubevirt.io/default-preference-kind"
)

// servedWithGuest is a hub serving acme/rhel:9 at digest, whose verdict
// reports guest (and the tenant's declared preference, if any).
func servedWithGuest(t *testing.T, digest, declared string, guest *api.GuestReport) *failClosedHub {
	t.Helper()
	st := oldSyncerStatus(digest, v1alpha1.PhaseReady)
	st.CanonicalDigest = digest
	h := newFailClosedHub(t, digest, st, "docker://registry.example.com/acme/rhel@"+digest)
	h.gate.set(digest, func(subject name.Digest) (*api.Verdict, error) {
		v, err := accepted("")(subject)
		v.Images[0].Preference = declared
		v.Images[0].Guest = guest
		return v, err
	})
	return h
}

func (h *failClosedHub) dataSource(t *testing.T) *cdiv1.DataSource {
	t.Helper()
	var ds cdiv1.DataSource
	if err := h.cluster.Client.Get(t.Context(), h.key, &ds); err != nil {
		t.Fatal(err)
	}
	return &ds
}

// TestTheHubPublishesTheGuestOnTheDataSource: on a real apiserver with
// CDI's CRDs, the DataSource of a served image carries the guest facts
// vm create reads and KubeVirt's preference with its kind; facts the gate
// did not find are absent, and an OS whose os-release is hostile still
// makes a valid object with no preference.
func TestTheHubPublishesTheGuestOnTheDataSource(t *testing.T) {
	t.Parallel()
	digest := "sha256:" + strings.Repeat("7", 64)
	for _, tc := range []struct {
		name        string
		declared    string
		guest       *api.GuestReport
		labels      map[string]string // the hint labels, exactly
		annotations map[string]string // the guest annotations, exactly
	}{
		{name: "rhel 9 booting with bios", guest: &api.GuestReport{
			PartitionTable: "mbr", Firmware: api.GuestFirmware{BIOS: true}, CloudInit: true,
			OS:      &api.GuestOS{ID: "rhel", VersionID: "9.4", PrettyName: "Red Hat Enterprise Linux 9.4 (Plow)"},
			Kernels: []api.GuestKernel{{Version: "5.14.0-427.el9.x86_64", Virtio: []string{"virtio_blk", "virtio_net"}}},
		},
			labels: map[string]string{preferenceLabel: "rhel.9", preferenceKindLabel: "VirtualMachineClusterPreference"},
			annotations: map[string]string{api.AnnotationGuestFirmware: "bios", api.AnnotationGuestVirtio: "block,net",
				api.AnnotationGuestOS: "Red Hat Enterprise Linux 9.4 (Plow)", api.AnnotationGuestOSID: "rhel", api.AnnotationGuestOSVersion: "9.4",
				api.AnnotationGuestInit: "cloud-init"}},
		{name: "declared preference wins", declared: "fedora", guest: &api.GuestReport{
			PartitionTable: "gpt", Firmware: api.GuestFirmware{UEFI: true}, OS: &api.GuestOS{ID: "rhel", VersionID: "9.4"},
			Kernels: []api.GuestKernel{{Version: "6.1"}},
		},
			labels:      map[string]string{preferenceLabel: "fedora", preferenceKindLabel: "VirtualMachineClusterPreference"},
			annotations: map[string]string{api.AnnotationGuestFirmware: "efi", api.AnnotationGuestVirtio: "none", api.AnnotationGuestOSID: "rhel", api.AnnotationGuestOSVersion: "9.4", api.AnnotationGuestInit: "none"}},
		{name: "guest not read", labels: map[string]string{}, annotations: map[string]string{}},
		{name: "hostile os-release", guest: &api.GuestReport{
			PartitionTable: "gpt",
			OS:             &api.GuestOS{ID: "rhel/../" + strings.Repeat("x", 200), VersionID: "9\n", PrettyName: "\x1b[2J" + strings.Repeat("é", 400)},
		},
			labels:      map[string]string{},
			annotations: map[string]string{api.AnnotationGuestOSID: ("rhel/../" + strings.Repeat("x", 200))[:api.MaxGuestOSName], api.AnnotationGuestOSVersion: "9", api.AnnotationGuestOS: "[2J" + strings.Repeat("é", 62), api.AnnotationGuestInit: "none"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := servedWithGuest(t, digest, tc.declared, tc.guest)
			if _, err := h.reconcile(t); err != nil {
				t.Fatal(err)
			}
			ds := h.dataSource(t)
			checkKeys(t, "DataSource label", ds.Labels, tc.labels, cdi.HintLabels)
			checkKeys(t, "DataSource annotation", ds.Annotations, tc.annotations, cdi.GuestAnnotationKeys)
			if ds.Spec.Source.PVC == nil || ds.Spec.Source.PVC.Name != h.dvName(digest) {
				t.Errorf("the DataSource serves %+v", ds.Spec.Source)
			}
		})
	}
}

// checkKeys compares the keys of have among keys with want.
func checkKeys(t *testing.T, what string, have, want map[string]string, keys []string) {
	t.Helper()
	got := map[string]string{}
	for _, k := range keys {
		if v, ok := have[k]; ok {
			got[k] = v
		}
	}
	if !maps.Equal(got, want) {
		t.Errorf("%ss %q, want %q", what, got, want)
	}
}

// TestAProviderTableFromAConfigMap: a provider's ConfigMap replaces the
// built-in table; a broken edit or a deleted ConfigMap keeps the last good
// table; a good edit reaches the DataSource, with hints the table no
// longer gives removed. A ConfigMap the apiserver stores but that is no
// table (a huge value, thousands of lines, an invalid preference name) is
// refused when the syncer starts.
func TestAProviderTableFromAConfigMap(t *testing.T) {
	t.Parallel()
	digest := "sha256:" + strings.Repeat("8", 64)
	h := servedWithGuest(t, digest, "", &api.GuestReport{PartitionTable: "gpt", OS: &api.GuestOS{ID: "rhel", VersionID: "9.4"}})
	ctx := t.Context()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "acme", Name: "preferences"},
		Data: map[string]string{hub.PreferenceTableKey: "# the provider's\nrhel 9 = provider.rhel9\n"}}
	h.cluster.Create(t, cm)
	prefs := &hub.Preferences{Reader: h.cluster.Client, Key: client.ObjectKeyFromObject(cm), Every: time.Nanosecond}
	if err := prefs.Load(ctx); err != nil {
		t.Fatal(err)
	}
	h.r.Preferences = prefs
	want := func(pref string) {
		t.Helper()
		bi, err := h.reconcile(t)
		if err != nil {
			t.Fatal(err)
		}
		labels := map[string]string{}
		if pref != "" {
			labels = map[string]string{preferenceLabel: pref, preferenceKindLabel: "VirtualMachineClusterPreference"}
		}
		checkKeys(t, "DataSource label", h.dataSource(t).Labels, labels, cdi.HintLabels)
		if bi.Status.Preference != pref {
			t.Errorf("the BaseImage's preference is %q, want %q", bi.Status.Preference, pref)
		}
	}
	want("provider.rhel9")

	edit := func(data map[string]string) {
		t.Helper()
		cm.Data = data
		if err := h.cluster.Client.Update(ctx, cm); err != nil {
			t.Fatal(err)
		}
	}
	edit(map[string]string{hub.PreferenceTableKey: "rhel 9 = Provider RHEL"})
	want("provider.rhel9")
	if err := h.cluster.Client.Delete(ctx, cm); err != nil {
		t.Fatal(err)
	}
	want("provider.rhel9")
	cm.ResourceVersion = ""
	cm.Data = map[string]string{hub.PreferenceTableKey: "rhel 9 = provider.rhel9b"}
	h.cluster.Create(t, cm)
	want("provider.rhel9b")
	edit(map[string]string{hub.PreferenceTableKey: "debian = debian"})
	want("")

	for name, data := range map[string]map[string]string{
		"huge value":         {hub.PreferenceTableKey: "rhel = rhel.9\n#" + strings.Repeat("x", 900<<10)},
		"thousands of lines": {hub.PreferenceTableKey: strings.Repeat("# a comment\n", 5000)},
		"odd preference":     {hub.PreferenceTableKey: "rhel = rhel;rm -rf"},
		"long preference":    {hub.PreferenceTableKey: "rhel = " + strings.Repeat("r", 64)},
		"another key":        {"table": "rhel = rhel.9"},
	} {
		bad := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "acme", Name: "bad-" + strings.ReplaceAll(name, " ", "-")}, Data: data}
		h.cluster.Create(t, bad)
		p := &hub.Preferences{Reader: h.cluster.Client, Key: client.ObjectKeyFromObject(bad)}
		if err := p.Load(ctx); !errors.Is(err, hub.ErrPreferenceTable) {
			t.Errorf("%s: the syncer starts with it (%v)", name, err)
		}
	}
	missing := &hub.Preferences{Reader: h.cluster.Client, Key: client.ObjectKey{Namespace: "acme", Name: "none"}}
	if err := missing.Load(ctx); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("a missing ConfigMap at start: %v", err)
	}
}

// TestVMCreateBootsTheDiskAsTheHubSays: a tenant's imagectl, with the
// tenant's own RBAC (config/tenant), reads the facts image-syncer put on
// the image's DataSource: a VM of a BIOS-only Windows image without virtio
// drivers boots with BIOS from SATA disks and shows its OS in vm get; a
// template pinning EFI is refused, naming the template, the firmware and
// what the disk boots with, and so is an SSH key, which a guest without
// cloud-init would never see. The tenant cannot write DataSources, and a
// DataSource image-syncer did not make says nothing.
func TestVMCreateBootsTheDiskAsTheHubSays(t *testing.T) {
	t.Parallel()
	h := startTenantHub(t, "hub-hints")
	ctx := t.Context()
	digest := "sha256:" + strings.Repeat("9", 64)
	for _, tag := range []string{"2022", "forged"} {
		bi := &v1alpha1.BaseImage{
			ObjectMeta: metav1.ObjectMeta{Name: cdi.BaseImageName("acme/win", tag), Namespace: "acme"},
			Spec:       v1alpha1.BaseImageSpec{Tenant: "acme", Repository: "registry.example.com/acme/win", Tag: tag},
		}
		if err := h.c.Create(ctx, bi); err != nil {
			t.Fatal(err)
		}
		bi.Status = v1alpha1.BaseImageStatus{Phase: v1alpha1.PhaseReady, ImportedDigest: digest, DataSourceName: bi.Name, VirtualSize: 1 << 30}
		if err := h.c.Status().Update(ctx, bi); err != nil {
			t.Fatal(err)
		}
		im := cdi.Import{Namespace: "acme", Tenant: "acme", Image: "win", Registry: "registry.example.com", Repository: "acme/win", Tag: tag, Digest: digest,
			Guest: &api.GuestReport{PartitionTable: "mbr", Firmware: api.GuestFirmware{BIOS: true},
				OS: &api.GuestOS{ID: "windows", PrettyName: "Windows Server 2022"}, Kernels: []api.GuestKernel{{Version: "10.0"}}}}
		ds := im.DataSource(bi.Name, "win-pvc")
		if tag == "forged" { // made by someone else than image-syncer
			delete(ds.Labels, cdi.LabelManagedBy)
		}
		if err := h.c.Create(ctx, ds); err != nil {
			t.Fatal(err)
		}
	}
	for _, verb := range []string{"update", "patch", "create"} {
		review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: "tenant-a",
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: "acme", Verb: verb, Group: "cdi.kubevirt.io", Resource: "datasources"}}}
		if err := h.c.Create(ctx, review); err != nil {
			t.Fatal(err)
		}
		if review.Status.Allowed {
			t.Errorf("a tenant may %s DataSources, and so forge what its images boot with", verb)
		}
	}

	dir := t.TempDir()
	plain, efi := filepath.Join(dir, "plain.json"), filepath.Join(dir, "efi.json")
	for file, doc := range map[string]string{
		plain: `{"id":"plain","title":"Plain","vm":{"memory":"1Gi"}}`,
		efi:   `{"id":"win_efi","title":"Windows on UEFI","vm":{"memory":"1Gi","firmware":"efi"}}`,
	} {
		if err := os.WriteFile(file, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tenant := func(args ...string) []string { return append(args, h.tenant...) }

	r := testenv.RunImagectl(t, tenant("vm", "create", "refused", "--image", "acme/win:2022", "--template-file", efi)...)
	if want := "template win_efi sets firmware efi, but image acme/win:2022 boots with BIOS only"; r.Code == 0 || !strings.Contains(r.Stderr, want) {
		t.Errorf("vm create with a template pinning EFI for a BIOS-only disk: exit %d\n%s\nwant %q", r.Code, r.Stderr, want)
	}

	// The gate found neither cloud-init nor cloudbase-init in it: an SSH
	// key given to its VM would never reach the guest, and is refused.
	pub := filepath.Join(dir, "id.pub")
	if err := os.WriteFile(pub, []byte("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAcsVPfueL32HuPta1atHVKCiYOsfacy4WvUzekllsyu tenant\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r = testenv.RunImagectl(t, tenant("vm", "create", "keyed", "--image", "acme/win:2022", "--template-file", plain, "--ssh-key", pub)...)
	if want := "image acme/win:2022 would never see the SSH keys"; r.Code == 0 || !strings.Contains(r.Stderr, want) || !strings.Contains(r.Stderr, "neither cloud-init nor cloudbase-init") {
		t.Errorf("vm create --ssh-key for a guest without cloud-init: exit %d\n%s\nwant %q", r.Code, r.Stderr, want)
	}

	testenv.RunImagectlOK(t, tenant("vm", "create", "win", "--image", "acme/win:2022", "--template-file", plain)...)
	var vm kubevirtv1.VirtualMachine
	if err := h.c.Get(ctx, client.ObjectKey{Namespace: "acme", Name: "win"}, &vm); err != nil {
		t.Fatal(err)
	}
	domain := vm.Spec.Template.Spec.Domain
	if fw := domain.Firmware; fw == nil || fw.Bootloader == nil || fw.Bootloader.BIOS == nil || fw.Bootloader.EFI != nil {
		t.Errorf("firmware %+v, want BIOS", fw)
	}
	for _, d := range domain.Devices.Disks {
		if d.Disk == nil || d.Disk.Bus != kubevirtv1.DiskBusSATA {
			t.Errorf("disk %s: %+v, want SATA (the guest has no virtio drivers)", d.Name, d.Disk)
		}
	}
	if w := testenv.RunImagectlOK(t, tenant("vm", "get", "win", "-o", "wide")...).Stdout; !strings.Contains(w, "OS") || !strings.Contains(w, "Windows Server 2022") {
		t.Errorf("vm get -o wide does not show the OS:\n%s", w)
	}
	var s api.VMSummary
	decodeStrict(t, "vm get -o json", testenv.RunImagectlOK(t, tenant("vm", "get", "win", "-o", "json")...).Stdout, &s)
	if s.OS != "Windows Server 2022" {
		t.Errorf("vm get -o json: os %q", s.OS)
	}

	testenv.RunImagectlOK(t, tenant("vm", "create", "forged", "--image", "acme/win:forged", "--template-file", efi)...)
	if err := h.c.Get(ctx, client.ObjectKey{Namespace: "acme", Name: "forged"}, &vm); err != nil {
		t.Fatal(err)
	}
	if fw := vm.Spec.Template.Spec.Domain.Firmware; fw == nil || fw.Bootloader == nil || fw.Bootloader.EFI == nil {
		t.Errorf("the facts of a DataSource image-syncer did not make were used: firmware %+v", fw)
	}
	if got := vm.Annotations[api.AnnotationGuestOS]; got != "" {
		t.Errorf("the OS of a DataSource image-syncer did not make was recorded: %q", got)
	}
}
