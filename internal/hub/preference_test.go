package hub

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

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
		{"windows", "10.0.20348", "amd64", "windows.2k22"},
		{"windows", "10.0.22631", "amd64", "windows.11"},
		{"windows", "10.0.26100", "amd64", ""},
		{"windows", "", "amd64", ""},
	} {
		g := &api.GuestReport{OS: &api.GuestOS{ID: tc.id, VersionID: tc.version}}
		if got := builtin.For(g, tc.arch); got != tc.want {
			t.Errorf("%s %s on %s: %q, want %q", tc.id, tc.version, tc.arch, got, tc.want)
		}
	}
	if got := builtin.For(&api.GuestReport{}, "amd64"); got != "" {
		t.Errorf("no OS found: %q", got)
	}
	if got := builtin.For(nil, "amd64"); got != "" {
		t.Errorf("not read: %q", got)
	}
}

// TestProviderPreferenceTables: a provider's table replaces the built-in
// one; the most specific rule wins; anything but the documented format,
// within its bounds, is refused naming the line.
func TestProviderPreferenceTables(t *testing.T) {
	table, err := ParsePreferenceTable(`
# provider table
windows = windows.2k22
rhel = rhel.legacy
rhel 9 = rhel.9
rhel 9.4 = rhel.9.4-tuned
rhel 9 arm64 = rhel.9.arm64
rhel arm64 = rhel.arm
`)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ id, version, arch, want string }{
		{"rhel", "9.4", "amd64", "rhel.9.4-tuned"},
		{"rhel", "9.40", "amd64", "rhel.9"},
		{"rhel", "9.4", "arm64", "rhel.9.4-tuned"},
		{"rhel", "9.2", "arm64", "rhel.9.arm64"},
		{"rhel", "90", "amd64", "rhel.legacy"},
		{"rhel", "8.1", "arm64", "rhel.arm"},
		{"rhel", "", "", "rhel.legacy"},
		{"windows", "10.0", "amd64", "windows.2k22"},
		{"debian", "12", "amd64", ""},
		{"RHEL", "9", "amd64", ""},
	} {
		if got := table.For(&api.GuestReport{OS: &api.GuestOS{ID: tc.id, VersionID: tc.version}}, tc.arch); got != tc.want {
			t.Errorf("%s %s on %s: %q, want %q", tc.id, tc.version, tc.arch, got, tc.want)
		}
	}

	for _, tc := range []struct{ name, text, want string }{
		{"no equals", "rhel rhel.9", "line 1"},
		{"empty preference", "rhel =", "preference"},
		{"preference not a label value", "rhel = " + strings.Repeat("a", 64), "at most 63"},
		{"preference with a slash", "rhel = rhel/9", "preference"},
		{"preference upper case", "rhel = RHEL", "preference"},
		{"preference with spaces", "rhel = rhel 9", "preference"},
		{"odd characters in ID", "rh$el = rhel", "ID"},
		{"ID upper case", "RHEL = rhel", "ID"},
		{"four fields", "rhel 9 amd64 x = rhel", "want ID"},
		{"version after arch", "rhel amd64 9 = rhel", "want ID"},
		{"unknown arch", "rhel 9 mips = rhel", "want ID"},
		{"repeated rule", "rhel 9 = a\nrhel 9 = b", "line 2"},
		{"control character", "rhel\x00 = rhel", "ID"},
		{"too many lines", strings.Repeat("\n", MaxPreferenceLines) + "rhel = rhel", "more than"},
		{"too large", "# " + strings.Repeat("x", MaxPreferenceTableBytes), "over the limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := ParsePreferenceTable(tc.text); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%q: %v, want an error with %q", tc.text, err, tc.want)
			}
		})
	}
	if _, err := ParsePreferenceTable(BuiltinPreferences); err != nil {
		t.Errorf("the built-in table: %v", err)
	}
}

// configMapReader plays the apiserver holding one ConfigMap, or failing.
type configMapReader struct {
	cm  *corev1.ConfigMap
	err error
}

func (r *configMapReader) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	if r.err != nil {
		return r.err
	}
	r.cm.DeepCopyInto(obj.(*corev1.ConfigMap))
	return nil
}

func (r *configMapReader) List(context.Context, client.ObjectList, ...client.ListOption) error {
	return errors.New("not listed")
}

// TestABrokenPreferenceTableKeepsTheLastGoodOne: a ConfigMap edited into
// something malformed, or gone, leaves the table read last in force, and
// says why in the log; a good edit is taken up.
func TestABrokenPreferenceTableKeepsTheLastGoodOne(t *testing.T) {
	rhel := &api.GuestReport{OS: &api.GuestOS{ID: "rhel", VersionID: "9.4"}}
	cm := func(text string) *corev1.ConfigMap {
		return &corev1.ConfigMap{Data: map[string]string{PreferenceTableKey: text}}
	}
	r := &configMapReader{cm: cm("rhel = provider.rhel")}
	var logs strings.Builder
	p := &Preferences{Reader: r, Key: client.ObjectKey{Namespace: "imagepipe-system", Name: "prefs"}, Every: time.Nanosecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	if err := p.Load(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := p.Table(t.Context()).For(rhel, ""); got != "provider.rhel" {
		t.Fatalf("the provider's table gives %q", got)
	}
	for _, broken := range []*configMapReader{
		{cm: cm("rhel = Not A Label")},
		{cm: &corev1.ConfigMap{Data: map[string]string{"other": "rhel = rhel.9"}}},
		{cm: &corev1.ConfigMap{Data: map[string]string{PreferenceTableKey: "rhel = rhel.9", "extra": ""}}},
		{err: errors.New("connection refused")},
	} {
		*r = *broken
		if got := p.Table(t.Context()).For(rhel, ""); got != "provider.rhel" {
			t.Errorf("with %+v in place the table gives %q; want the last good one's provider.rhel", broken, got)
		}
	}
	if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "Not A Label") || !strings.Contains(logs.String(), "connection refused") {
		t.Errorf("the failures are not logged as errors:\n%s", logs.String())
	}
	*r = configMapReader{cm: cm("rhel = provider.rhel2")}
	if got := p.Table(t.Context()).For(rhel, ""); got != "provider.rhel2" {
		t.Errorf("a good edit is not taken up: %q", got)
	}
	fresh := &Preferences{Reader: &configMapReader{cm: cm("rhel 9 = x y")}, Key: p.Key}
	if err := fresh.Load(t.Context()); !errors.Is(err, ErrPreferenceTable) {
		t.Errorf("a malformed table at start: %v", err)
	}
}

// FuzzParsePreferenceTable: any text is a table or an error, never a
// panic; a table only ever gives preferences that are label values, and
// For agrees with a rule-by-rule reading of the text.
func FuzzParsePreferenceTable(f *testing.F) {
	f.Add(BuiltinPreferences, "rhel", "9.4", "arm64")
	f.Add("rhel 9 = a\nrhel = b\n", "rhel", "90", "amd64")
	f.Add("# c\n\nx 1.2 s390x = y.z\n", "x", "1.2.3", "s390x")
	f.Fuzz(func(t *testing.T, text, id, version, arch string) {
		table, err := ParsePreferenceTable(text)
		if err != nil {
			return
		}
		got := table.For(&api.GuestReport{OS: &api.GuestOS{ID: id, VersionID: version}}, arch)
		if got == "" {
			return
		}
		if errs := validation.IsValidLabelValue(got); len(errs) > 0 {
			t.Fatalf("the table gives %q, not a label value: %v", got, errs)
		}
		found := false
		for line := range strings.Lines(text) {
			lhs, rhs, ok := strings.Cut(line, "=")
			if ok && strings.TrimSpace(rhs) == got && len(strings.Fields(lhs)) > 0 && strings.Fields(lhs)[0] == id {
				found = true
			}
		}
		if !found {
			t.Fatalf("%q gives %q for ID %q, which no rule for that ID names", text, got, id)
		}
	})
}
