package hub

import (
	"testing"

	"github.com/imagepipe/imagepipe/pkg/api"
)

// TestPreferenceForTheGuest: the preference names are common-instancetypes'
// own (as its README lists them), per os-release ID and major version;
// an OS the table does not know, or none found, gives no hint.
func TestPreferenceForTheGuest(t *testing.T) {
	for _, tc := range []struct {
		id, version, arch, want string
	}{
		{"debian", "12", "amd64", "debian"},
		{"ubuntu", "24.04", "amd64", "ubuntu"},
		{"fedora", "41", "amd64", "fedora"},
		{"fedora", "41", "arm64", "fedora.arm64"},
		{"rhel", "9.4", "amd64", "rhel.9"},
		{"rhel", "9.4", "arm64", "rhel.9.arm64"},
		{"rhel", "8.10", "arm64", "rhel.8"},
		{"rhel", "6.10", "amd64", ""},
		{"centos", "9", "amd64", "centos.stream9"},
		{"centos", "7", "amd64", ""},
		{"opensuse-leap", "15.6", "amd64", "opensuse.leap"},
		{"ol", "9.4", "amd64", "oraclelinux"},
		{"arch", "", "amd64", ""},
	} {
		g := &api.GuestReport{OS: &api.GuestOS{ID: tc.id, VersionID: tc.version}}
		if got := preferenceFor(g, tc.arch); got != tc.want {
			t.Errorf("%s %s on %s: %q, want %q", tc.id, tc.version, tc.arch, got, tc.want)
		}
	}
	if got := preferenceFor(&api.GuestReport{}, "amd64"); got != "" {
		t.Errorf("no OS found: %q", got)
	}
	if got := preferenceFor(nil, "amd64"); got != "" {
		t.Errorf("not read: %q", got)
	}
}
