package registry

import (
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

func TestParsePlatform(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Platform
		err  string // part of the error; "" for none
	}{
		{in: "linux/amd64", want: Platform{OS: "linux", Architecture: "amd64"}},
		{in: "linux/arm64", want: Platform{OS: "linux", Architecture: "arm64"}},
		{in: "linux/arm64/v8", want: Platform{OS: "linux", Architecture: "arm64", Variant: "v8"}},
		{in: "linux/arm/v7", want: Platform{OS: "linux", Architecture: "arm", Variant: "v7"}},
		{in: "linux/s390x", want: Platform{OS: "linux", Architecture: "s390x"}},
		{in: "linux/ppc64le", want: Platform{OS: "linux", Architecture: "ppc64le"}},
		{in: "linux/riscv64", want: Platform{OS: "linux", Architecture: "riscv64"}},
		{in: "linux/amd64/v3", want: Platform{OS: "linux", Architecture: "amd64", Variant: "v3"}},

		{in: "windows/amd64", err: "the OS must be linux"},
		{in: "darwin/arm64", err: "the OS must be linux"},
		{in: "Linux/amd64", err: "the OS must be linux"},
		{in: " linux/amd64", err: "the OS must be linux"},
		{in: "linux/x86_64", err: "did you mean linux/amd64?"},
		{in: "linux/aarch64", err: "did you mean linux/arm64?"},
		{in: "linux/AMD64", err: "unknown architecture"},
		{in: "linux/wasm", err: "unknown architecture"},
		{in: "linux/sparc", err: "unknown architecture"},
		{in: "linux/s390x/v1", err: "s390x has no variants"},
		{in: "linux/arm64/v7", err: `unknown variant "v7" of arm64`},
		{in: "linux", err: "not os/arch"},
		{in: "amd64", err: "not os/arch"},
		{in: "", err: "not os/arch"},
		{in: "linux/", err: "not os/arch"},
		{in: "linux//v8", err: "not os/arch"},
		{in: "linux/arm64/", err: "not os/arch"},
		{in: "linux/arm/v7/extra", err: "not os/arch"},
		{in: "linux/amd64:10.0", err: "only exists for windows"},
	} {
		got, err := ParsePlatform(tc.in)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("ParsePlatform(%q): %v", tc.in, err)
		case tc.err == "" && got != tc.want:
			t.Errorf("ParsePlatform(%q) = %+v, want %+v", tc.in, got, tc.want)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("ParsePlatform(%q) = %+v, %v; want an error saying %q", tc.in, got, err, tc.err)
		}
		if err == nil && got.String() != tc.in {
			t.Errorf("ParsePlatform(%q).String() = %q", tc.in, got.String())
		}
	}
}

func TestPlatformMatching(t *testing.T) {
	p := func(s string) Platform {
		t.Helper()
		pl, err := ParsePlatform(s)
		if err != nil {
			t.Fatal(err)
		}
		return pl
	}
	entry := func(os, arch, variant string) *v1.Platform {
		return &v1.Platform{OS: os, Architecture: arch, Variant: variant}
	}
	for _, tc := range []struct {
		want  Platform
		entry *v1.Platform
		match bool
	}{
		{p("linux/amd64"), entry("linux", "amd64", ""), true},
		{p("linux/amd64"), entry("linux", "arm64", ""), false},
		{p("linux/amd64"), entry("windows", "amd64", ""), false},
		{p("linux/amd64"), nil, false},
		// No variant asked: every variant matches (an index holding two is
		// ambiguous, which resolve refuses).
		{p("linux/arm64"), entry("linux", "arm64", "v8"), true},
		{p("linux/arm"), entry("linux", "arm", "v6"), true},
		// A variant asked: an empty one is the architecture's default.
		{p("linux/arm64/v8"), entry("linux", "arm64", ""), true},
		{p("linux/arm64/v8"), entry("linux", "arm64", "v8"), true},
		{p("linux/arm/v7"), entry("linux", "arm", ""), true},
		{p("linux/arm/v6"), entry("linux", "arm", ""), false},
		{p("linux/arm/v6"), entry("linux", "arm", "v7"), false},
	} {
		if got := tc.want.matches(tc.entry); got != tc.match {
			t.Errorf("%s matches %+v = %v, want %v", tc.want, tc.entry, got, tc.match)
		}
	}
	if !samePlatform(entry("linux", "arm64", ""), entry("linux", "arm64", "v8")) || samePlatform(entry("linux", "arm", "v6"), entry("linux", "arm", "v7")) {
		t.Error("samePlatform: arm64 and arm64/v8 are one platform, arm/v6 and arm/v7 two")
	}
	if !agrees(entry("linux", "arm64", "v8"), &v1.ConfigFile{OS: "linux", Architecture: "arm64"}) ||
		!agrees(entry("linux", "arm64", ""), &v1.ConfigFile{}) ||
		agrees(entry("linux", "arm64", ""), &v1.ConfigFile{OS: "linux", Architecture: "amd64"}) ||
		agrees(entry("linux", "arm", "v6"), &v1.ConfigFile{OS: "linux", Architecture: "arm", Variant: "v7"}) {
		t.Error("agrees: a config agrees with its entry when every field it sets is the entry's")
	}
}
