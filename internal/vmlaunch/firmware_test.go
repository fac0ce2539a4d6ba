package vmlaunch

import (
	"errors"
	"strings"
	"testing"

	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/imagepipe/imagepipe/internal/cdi"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// TestTheVMBootsTheDiskAsTheGateFoundIt: the firmware and disk bus come
// from the image's facts unless the template pins them; unknown facts
// change nothing; a template pinning a firmware the disk cannot boot with
// is refused with a sentence naming the template, its firmware and what
// the disk boots with.
func TestTheVMBootsTheDiskAsTheGateFoundIt(t *testing.T) {
	bios, efi, both := cdi.FirmwareBIOS, cdi.FirmwareEFI, cdi.FirmwareBoth
	noVirtio := cdi.GuestFacts{VirtioKnown: true}
	for _, tc := range []struct {
		name              string
		firmware, diskBus string // the template's vm section; "" unset
		guest             cdi.GuestFacts
		wantFirmware      string // bios, efi, efi-secureboot, or "" for none set
		wantBus           kubevirtv1.DiskBus
		refused           string
	}{
		{name: "unknown guest", wantBus: "virtio"},
		{name: "bios-only disk", guest: cdi.GuestFacts{Firmware: bios}, wantFirmware: "bios", wantBus: "virtio"},
		{name: "uefi-only disk", guest: cdi.GuestFacts{Firmware: efi}, wantFirmware: "efi", wantBus: "virtio"},
		{name: "disk boots with both", guest: cdi.GuestFacts{Firmware: both}, wantBus: "virtio"},
		{name: "no virtio drivers", guest: noVirtio, wantBus: "sata"},
		{name: "virtio net only", guest: cdi.GuestFacts{VirtioKnown: true, Virtio: []string{cdi.VirtioNet}}, wantBus: "sata"},
		{name: "virtio block", guest: cdi.GuestFacts{VirtioKnown: true, Virtio: []string{cdi.VirtioBlock}}, wantBus: "virtio"},
		{name: "template pins efi for a disk booting with both", firmware: "efi", guest: cdi.GuestFacts{Firmware: both}, wantFirmware: "efi", wantBus: "virtio"},
		{name: "template pins bios, guest unknown", firmware: "bios", wantFirmware: "bios", wantBus: "virtio"},
		{name: "template pins secure boot", firmware: "efi-secureboot", guest: cdi.GuestFacts{Firmware: efi}, wantFirmware: "efi-secureboot", wantBus: "virtio"},
		{name: "template pins the bus", diskBus: "scsi", guest: noVirtio, wantBus: "scsi"},
		{name: "template pins efi, bios-only disk", firmware: "efi", guest: cdi.GuestFacts{Firmware: bios},
			refused: "template pinned sets firmware efi, but image acme/rhel:9 boots with BIOS only"},
		{name: "template pins secure boot, bios-only disk", firmware: "efi-secureboot", guest: cdi.GuestFacts{Firmware: bios},
			refused: "sets firmware efi-secureboot, but image acme/rhel:9 boots with BIOS only"},
		{name: "template pins bios, uefi-only disk", firmware: "bios", guest: cdi.GuestFacts{Firmware: efi},
			refused: "template pinned sets firmware bios, but image acme/rhel:9 boots with UEFI only"},
		{name: "template pins secure boot, signed loader", firmware: "efi-secureboot", guest: cdi.GuestFacts{Firmware: efi, SecureBoot: cdi.SecureBootSigned}, wantFirmware: "efi-secureboot", wantBus: "virtio"},
		{name: "template pins secure boot, unsigned loader", firmware: "efi-secureboot", guest: cdi.GuestFacts{Firmware: efi, SecureBoot: cdi.SecureBootUnsigned},
			refused: "sets firmware efi-secureboot, but image acme/rhel:9 has an unsigned EFI loader"},
		{name: "template pins efi, unsigned loader", firmware: "efi", guest: cdi.GuestFacts{Firmware: efi, SecureBoot: cdi.SecureBootUnsigned}, wantFirmware: "efi", wantBus: "virtio"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			doc := `{"id":"pinned","title":"Pinned","parameters":[{"name":"fw","type":"string","default":{"value":"` + tc.firmware +
				`"}},{"name":"bus","type":"string","default":{"value":"` + tc.diskBus + `"}}],"vm":{"memory":"1Gi","firmware":"${fw}","diskBus":"${bus}"}}`
			req := RenderCases()["simple-defaults"]
			req.Template = mustParse(t, doc)
			values, err := ResolveParameters(req.Template, nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Values, req.SSHKeys = values, []string{"ssh-ed25519 AAAA k"}
			req.Image.Guest = tc.guest
			out, err := Render(req)
			if tc.refused != "" {
				var fe *FirmwareError
				if err == nil || !errors.As(err, &fe) || !strings.Contains(err.Error(), tc.refused) {
					t.Fatalf("rendered (%v); want it refused with %q", err, tc.refused)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			spec := out.VM.Spec.Template.Spec.Domain
			if got := firmwareOf(spec.Firmware); got != tc.wantFirmware {
				t.Errorf("firmware %q, want %q", got, tc.wantFirmware)
			}
			if sb := tc.wantFirmware == "efi-secureboot"; sb != (spec.Features != nil && spec.Features.SMM != nil && *spec.Features.SMM.Enabled) {
				t.Errorf("SMM %+v with firmware %q: KubeVirt refuses Secure Boot without SMM", spec.Features, tc.wantFirmware)
			}
			for _, d := range spec.Devices.Disks {
				if d.Disk.Bus != tc.wantBus {
					t.Errorf("disk %s on %s, want %s", d.Name, d.Disk.Bus, tc.wantBus)
				}
			}
		})
	}
}

func mustParse(t *testing.T, doc string) *api.VMTemplate {
	t.Helper()
	tmpl, err := ParseTemplate([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return tmpl
}

// firmwareOf names a rendered firmware: bios, efi (Secure Boot off),
// efi-secureboot, or "" when none is set.
func firmwareOf(fw *kubevirtv1.Firmware) string {
	switch {
	case fw == nil || fw.Bootloader == nil:
		return ""
	case fw.Bootloader.BIOS != nil:
		return "bios"
	case fw.Bootloader.EFI != nil && fw.Bootloader.EFI.SecureBoot != nil && !*fw.Bootloader.EFI.SecureBoot:
		return "efi"
	case fw.Bootloader.EFI != nil:
		return "efi-secureboot"
	}
	return "?"
}

// TestFirmwareAndDiskBusTakeOnlyTheirValues: a template's literal is
// checked when it is published, a parameter's value when it is rendered.
func TestFirmwareAndDiskBusTakeOnlyTheirValues(t *testing.T) {
	for _, doc := range []string{
		`{"id":"x","title":"X","vm":{"memory":"1Gi","firmware":"uefi"}}`,
		`{"id":"x","title":"X","vm":{"memory":"1Gi","diskBus":"ide"}}`,
	} {
		if _, err := ParseTemplate([]byte(doc)); err == nil || !strings.Contains(err.Error(), "want one of") {
			t.Errorf("%s: %v", doc, err)
		}
	}
	req := RenderCases()["simple-defaults"]
	req.Template = mustParse(t, `{"id":"x","title":"X","parameters":[{"name":"fw","default":{"value":"bios"}}],"vm":{"memory":"1Gi","firmware":"${fw}"}}`)
	values, err := ResolveParameters(req.Template, []string{"fw=EFI"})
	if err != nil {
		t.Fatal(err)
	}
	req.Values = values
	if _, err := Render(req); err == nil || !strings.Contains(err.Error(), `vm.firmware: "EFI": want one of bios, efi, efi-secureboot`) {
		t.Errorf("a parameter set to EFI: %v", err)
	}
}

// TestVMRecordsTheGuestOS: vm create records the OS the DataSource names,
// which vm get and list show, as printable text even when the annotation
// was edited.
func TestVMRecordsTheGuestOS(t *testing.T) {
	req := RenderCases()["simple-defaults"]
	req.Image.Guest = cdi.GuestFacts{OSName: "Debian GNU/Linux 12 (bookworm)"}
	out, err := Render(req)
	if err != nil {
		t.Fatal(err)
	}
	if got := summary(out.VM).OS; got != "Debian GNU/Linux 12 (bookworm)" {
		t.Errorf("the summary's OS is %q", got)
	}
	out.VM.Annotations[api.AnnotationGuestOS] = "evil\x1b]0;title\x07"
	if got := summary(out.VM).OS; got != "evil]0;title" {
		t.Errorf("an edited annotation shows as %q", got)
	}
	req.Image.Guest = cdi.GuestFacts{}
	if out, _ := Render(req); out.VM.Annotations[api.AnnotationGuestOS] != "" {
		t.Errorf("an unknown OS is recorded as %q", out.VM.Annotations[api.AnnotationGuestOS])
	}
}
