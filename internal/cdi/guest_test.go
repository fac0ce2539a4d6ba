package cdi

import (
	"maps"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/imagepipe/imagepipe/pkg/api"
)

// TestGuestFactsOnTheDataSource: what the gate read becomes annotations
// that read back to the same facts; an unknown fact writes nothing, and a
// value outside the grammar (an edited annotation) reads as unknown.
func TestGuestFactsOnTheDataSource(t *testing.T) {
	for _, tc := range []struct {
		name  string
		guest *api.GuestReport
		want  map[string]string
	}{
		{"not read", nil, map[string]string{}},
		{"nothing found", &api.GuestReport{PartitionTable: "unknown"}, map[string]string{}},
		{"bios only, virtio", &api.GuestReport{
			Firmware: api.GuestFirmware{BIOS: true},
			OS:       &api.GuestOS{ID: "rhel", VersionID: "9.4", PrettyName: "Red Hat Enterprise Linux 9.4 (Plow)"},
			Kernels:  []api.GuestKernel{{Version: "5.14", Virtio: []string{"virtio_net", "virtio_blk", "virtio_scsi"}}, {Version: "5.13"}},
		}, map[string]string{
			api.AnnotationGuestFirmware: "bios", api.AnnotationGuestVirtio: "block,net,scsi",
			api.AnnotationGuestOS: "Red Hat Enterprise Linux 9.4 (Plow)", api.AnnotationGuestOSID: "rhel", api.AnnotationGuestOSVersion: "9.4",
			api.AnnotationGuestInit: "none",
		}},
		{"cloud-init", &api.GuestReport{OS: &api.GuestOS{ID: "debian"}, CloudInit: true, Ignition: true},
			map[string]string{api.AnnotationGuestOSID: "debian", api.AnnotationGuestInit: "cloud-init"}},
		{"ignition", &api.GuestReport{OS: &api.GuestOS{ID: "fedora-coreos"}, Ignition: true},
			map[string]string{api.AnnotationGuestOSID: "fedora-coreos", api.AnnotationGuestInit: "ignition"}},
		{"cloudbase-init", &api.GuestReport{OS: &api.GuestOS{ID: "windows"}, CloudbaseInit: true},
			map[string]string{api.AnnotationGuestOSID: "windows", api.AnnotationGuestInit: "cloudbase-init"}},
		{"uefi only, kernel without virtio", &api.GuestReport{
			Firmware: api.GuestFirmware{UEFI: true},
			Kernels:  []api.GuestKernel{{Version: "6.1"}},
		}, map[string]string{api.AnnotationGuestFirmware: "efi", api.AnnotationGuestVirtio: "none"}},
		{"both, windows drivers", &api.GuestReport{
			Firmware: api.GuestFirmware{BIOS: true, UEFI: true},
			Kernels:  []api.GuestKernel{{Version: "nt", Virtio: []string{"netkvm", "viostor", "made_up"}}},
		}, map[string]string{api.AnnotationGuestFirmware: "bios+efi", api.AnnotationGuestVirtio: "block,net"}},
		{"uefi, a signed loader", &api.GuestReport{
			Firmware: api.GuestFirmware{UEFI: true, Loaders: []string{"/EFI/BOOT/BOOTX64.EFI"}, SecureBoot: true},
		}, map[string]string{api.AnnotationGuestFirmware: "efi", api.AnnotationGuestSecureBoot: "signed"}},
		{"uefi, an unsigned loader", &api.GuestReport{
			Firmware: api.GuestFirmware{UEFI: true, Loaders: []string{"/EFI/BOOT/BOOTX64.EFI"}},
		}, map[string]string{api.AnnotationGuestFirmware: "efi", api.AnnotationGuestSecureBoot: "unsigned"}},
		{"hostile os-release", &api.GuestReport{
			OS: &api.GuestOS{ID: "x\n\x1b[31mevil", PrettyName: strings.Repeat("é", 500), VersionID: "\xff\xfe"},
		}, map[string]string{api.AnnotationGuestOSID: "x[31mevil", api.AnnotationGuestOS: strings.Repeat("é", api.MaxGuestOSName/2), api.AnnotationGuestInit: "none"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := FactsOf(tc.guest)
			got := f.Annotations()
			if !maps.Equal(got, tc.want) {
				t.Errorf("annotations %q, want %q", got, tc.want)
			}
			for k, v := range got {
				if !utf8.ValidString(v) || len(v) > api.MaxGuestOSName {
					t.Errorf("%s=%q: not bounded printable text", k, v)
				}
			}
			back := ParseGuestFacts(got)
			if !maps.Equal(back.Annotations(), got) {
				t.Errorf("read back as %+v, annotations %q", back, back.Annotations())
			}
		})
	}
	for _, tc := range []struct {
		ann  map[string]string
		want GuestFacts
	}{
		{map[string]string{api.AnnotationGuestFirmware: "efi+secureboot"}, GuestFacts{}},
		{map[string]string{api.AnnotationGuestFirmware: "BIOS"}, GuestFacts{}},
		{map[string]string{api.AnnotationGuestVirtio: "block,floppy"}, GuestFacts{}},
		{map[string]string{api.AnnotationGuestVirtio: ""}, GuestFacts{}},
		{map[string]string{api.AnnotationGuestVirtio: "none"}, GuestFacts{VirtioKnown: true}},
		{map[string]string{api.AnnotationGuestVirtio: "net"}, GuestFacts{VirtioKnown: true, Virtio: []string{"net"}}},
		{map[string]string{api.AnnotationGuestInit: "Cloud-Init"}, GuestFacts{}},
		{map[string]string{api.AnnotationGuestInit: "ignition"}, GuestFacts{Init: InitIgnition}},
	} {
		got := ParseGuestFacts(tc.ann)
		if got.Firmware != tc.want.Firmware || got.Init != tc.want.Init || got.VirtioKnown != tc.want.VirtioKnown || strings.Join(got.Virtio, ",") != strings.Join(tc.want.Virtio, ",") {
			t.Errorf("%q read as %+v, want %+v", tc.ann, got, tc.want)
		}
	}
}

// TestTheDataSourceCarriesTheGuestAndTheHints: the DataSource VMs clone
// from says what the guest is, and a preference comes with its kind.
func TestTheDataSourceCarriesTheGuestAndTheHints(t *testing.T) {
	im := Import{Namespace: "acme", Tenant: "acme", Image: "rhel", Registry: "r.example", Repository: "acme/rhel", Tag: "9",
		Digest: "sha256:" + strings.Repeat("ab", 32), Preference: "rhel.9",
		Guest: &api.GuestReport{Firmware: api.GuestFirmware{UEFI: true}}}
	ds := im.DataSource("rhel-9", "pvc")
	if ds.Annotations[api.AnnotationGuestFirmware] != "efi" || ds.Annotations[AnnotationTag] != "9" {
		t.Errorf("annotations %v", ds.Annotations)
	}
	if ds.Labels[preferenceKey] != "rhel.9" || ds.Labels[preferenceKindKey] != "VirtualMachineClusterPreference" {
		t.Errorf("labels %v", ds.Labels)
	}
	im.Preference = ""
	if l := im.DataSource("rhel-9", "pvc").Labels; l[preferenceKindKey] != "" {
		t.Errorf("a kind without a preference: %v", l)
	}
}
