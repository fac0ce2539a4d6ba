package cdi

import (
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/imagepipe/imagepipe/pkg/api"
)

// Values of api.AnnotationGuestSecureBoot.
const (
	SecureBootSigned   = "signed"
	SecureBootUnsigned = "unsigned"
)

// Firmware values of api.AnnotationGuestFirmware.
const (
	FirmwareBIOS = "bios"
	FirmwareEFI  = "efi"
	FirmwareBoth = "bios+efi"
)

// Virtio device kinds of api.AnnotationGuestVirtio.
const (
	VirtioBlock = "block"
	VirtioNet   = "net"
	VirtioSCSI  = "scsi"
	virtioNone  = "none"
)

// virtioKinds maps guest driver names, Linux's and Windows', to the kind
// of virtio device they drive.
var virtioKinds = map[string]string{
	"virtio_blk": VirtioBlock, "viostor": VirtioBlock,
	"virtio_net": VirtioNet, "netkvm": VirtioNet,
	"virtio_scsi": VirtioSCSI, "vioscsi": VirtioSCSI,
}

// Values of api.AnnotationGuestInit: what configures the guest at its
// first boot.
const (
	InitCloudInit     = "cloud-init"
	InitCloudbaseInit = "cloudbase-init"
	InitIgnition      = "ignition"
	InitNone          = "none"
)

// GuestFacts are what a DataSource says of the guest on its volume, in the
// api.AnnotationGuest* annotations. An empty field is unknown.
type GuestFacts struct {
	// Firmware is FirmwareBIOS, FirmwareEFI or FirmwareBoth.
	Firmware string
	// SecureBoot is SecureBootSigned or SecureBootUnsigned when an EFI
	// loader was found: whether it can start under Secure Boot.
	SecureBoot string
	// Virtio are the virtio device kinds the guest has drivers for
	// (sorted), meaningful only when VirtioKnown.
	Virtio      []string
	VirtioKnown bool
	// OSName, OSID and OSVersion are os-release's PRETTY_NAME, ID and
	// VERSION_ID, each at most api.MaxGuestOSName bytes of printable text.
	OSName, OSID, OSVersion string
	// Init is what configures the guest at its first boot (Init*), known
	// when the guest's system was read.
	Init string
}

// IgnoresNoCloud reports whether the guest is known not to read the
// NoCloud data KubeVirt gives it (user data, SSH keys): false when it
// does or when nobody knows.
func (f GuestFacts) IgnoresNoCloud() bool { return f.Init == InitIgnition || f.Init == InitNone }

// FactsOf is what the DataSource says of a guest the gate reported on;
// a nil report, or an empty one, gives no facts. The virtio drivers are
// the newest kernel's, the one a guest boots by default.
func FactsOf(g *api.GuestReport) GuestFacts {
	var f GuestFacts
	if g == nil {
		return f
	}
	switch {
	case g.Firmware.BIOS && g.Firmware.UEFI:
		f.Firmware = FirmwareBoth
	case g.Firmware.BIOS:
		f.Firmware = FirmwareBIOS
	case g.Firmware.UEFI:
		f.Firmware = FirmwareEFI
	}
	switch {
	case g.Firmware.SecureBoot:
		f.SecureBoot = SecureBootSigned
	case len(g.Firmware.Loaders) > 0:
		f.SecureBoot = SecureBootUnsigned
	}
	if len(g.Kernels) > 0 {
		f.VirtioKnown = true
		for _, d := range g.Kernels[0].Virtio {
			if k, ok := virtioKinds[d]; ok && !slices.Contains(f.Virtio, k) {
				f.Virtio = append(f.Virtio, k)
			}
		}
		slices.Sort(f.Virtio)
	}
	if g.OS != nil {
		f.OSName, f.OSID, f.OSVersion = printable(g.OS.PrettyName), printable(g.OS.ID), printable(g.OS.VersionID)
		switch {
		case g.CloudInit:
			f.Init = InitCloudInit
		case g.CloudbaseInit:
			f.Init = InitCloudbaseInit
		case g.Ignition:
			f.Init = InitIgnition
		default:
			f.Init = InitNone
		}
	}
	return f
}

// printable is s without control characters or invalid UTF-8, at most
// api.MaxGuestOSName bytes: what an annotation shown to people may hold
// of the guest's own bytes.
func printable(s string) string {
	s = strings.Map(func(r rune) rune {
		if r == unicode.ReplacementChar || !unicode.IsPrint(r) {
			return -1
		}
		return r
	}, strings.ToValidUTF8(s, ""))
	for len(s) > api.MaxGuestOSName {
		_, size := utf8.DecodeLastRuneInString(s)
		s = s[:len(s)-size]
	}
	return strings.TrimSpace(s)
}

// Annotations are the facts as DataSource annotations: only the known ones.
func (f GuestFacts) Annotations() map[string]string {
	a := map[string]string{}
	set := func(k, v string) {
		if v != "" {
			a[k] = v
		}
	}
	set(api.AnnotationGuestFirmware, f.Firmware)
	set(api.AnnotationGuestSecureBoot, f.SecureBoot)
	set(api.AnnotationGuestOS, f.OSName)
	set(api.AnnotationGuestOSID, f.OSID)
	set(api.AnnotationGuestOSVersion, f.OSVersion)
	set(api.AnnotationGuestInit, f.Init)
	if f.VirtioKnown {
		v := strings.Join(f.Virtio, ",")
		if v == "" {
			v = virtioNone
		}
		a[api.AnnotationGuestVirtio] = v
	}
	return a
}

// ParseGuestFacts reads the facts from a DataSource's annotations. A value
// outside the grammar is unknown, never a guess.
func ParseGuestFacts(a map[string]string) GuestFacts {
	var f GuestFacts
	switch v := a[api.AnnotationGuestFirmware]; v {
	case FirmwareBIOS, FirmwareEFI, FirmwareBoth:
		f.Firmware = v
	}
	switch v := a[api.AnnotationGuestSecureBoot]; v {
	case SecureBootSigned, SecureBootUnsigned:
		f.SecureBoot = v
	}
	f.OSName, f.OSID, f.OSVersion = printable(a[api.AnnotationGuestOS]), printable(a[api.AnnotationGuestOSID]), printable(a[api.AnnotationGuestOSVersion])
	switch v := a[api.AnnotationGuestInit]; v {
	case InitCloudInit, InitCloudbaseInit, InitIgnition, InitNone:
		f.Init = v
	}
	switch v, ok := a[api.AnnotationGuestVirtio]; {
	case !ok:
	case v == virtioNone:
		f.VirtioKnown = true
	default:
		kinds := strings.Split(v, ",")
		for _, k := range kinds {
			if k != VirtioBlock && k != VirtioNet && k != VirtioSCSI {
				return GuestFacts{Firmware: f.Firmware, SecureBoot: f.SecureBoot, OSName: f.OSName, OSID: f.OSID, OSVersion: f.OSVersion, Init: f.Init}
			}
		}
		slices.Sort(kinds)
		f.Virtio, f.VirtioKnown = slices.Compact(kinds), true
	}
	return f
}

// GuestAnnotationKeys are the annotations GuestFacts writes: the syncer
// removes those a new report no longer knows.
var GuestAnnotationKeys = []string{
	api.AnnotationGuestFirmware, api.AnnotationGuestSecureBoot, api.AnnotationGuestVirtio, api.AnnotationGuestOS, api.AnnotationGuestOSID, api.AnnotationGuestOSVersion, api.AnnotationGuestInit,
}

// Has reports whether the guest is known to have drivers for the virtio
// device kind (VirtioBlock, ...); known is false when nobody looked.
func (f GuestFacts) Has(kind string) (has, known bool) {
	return slices.Contains(f.Virtio, kind), f.VirtioKnown
}
