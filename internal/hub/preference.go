package hub

import (
	"strings"

	"github.com/imagepipe/imagepipe/pkg/api"
)

// preferenceFor is the preference of KubeVirt's common-instancetypes
// (github.com/kubevirt/common-instancetypes) that fits the operating
// system the gate found in an image for a hub of architecture arch, or
// "" when none is known to fit: a wrong hint is worse than none. The
// table is keyed by os-release's ID, and by the major VERSION_ID where
// the preferences are per version.
func preferenceFor(g *api.GuestReport, arch string) string {
	if g == nil || g.OS == nil {
		return ""
	}
	major, _, _ := strings.Cut(g.OS.VersionID, ".")
	switch g.OS.ID {
	case "alpine", "cirros", "debian", "ubuntu", "sles":
		return g.OS.ID
	case "fedora":
		if arch == "arm64" {
			return "fedora.arm64"
		}
		return "fedora"
	case "centos":
		if major == "9" || major == "10" {
			return "centos.stream" + major
		}
	case "rhel":
		switch {
		case (major == "9" || major == "10") && arch == "arm64":
			return "rhel." + major + ".arm64"
		case major == "7" || major == "8" || major == "9" || major == "10":
			return "rhel." + major
		}
	case "opensuse-leap":
		return "opensuse.leap"
	case "opensuse-tumbleweed":
		return "opensuse.tumbleweed"
	case "ol":
		return "oraclelinux"
	}
	return ""
}
