package registry

import (
	"fmt"
	"slices"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Platform is the machine a containerDisk is for: the OS and CPU
// architecture of the nodes that run it (not the guest's operating
// system: a Windows guest's disk is a linux/amd64 containerDisk), and for
// some architectures a variant. It is spelled "os/arch[/variant]", as
// crane, docker and oras spell it.
type Platform struct {
	OS, Architecture, Variant string
}

// DefaultPlatform is linux/amd64: what an import builds without a
// platform, and the image an index resolves to when nobody asked for
// another.
var DefaultPlatform = Platform{OS: "linux", Architecture: "amd64"}

// String is "os/arch" or "os/arch/variant".
func (p Platform) String() string {
	s := p.OS + "/" + p.Architecture
	if p.Variant != "" {
		s += "/" + p.Variant
	}
	return s
}

// architectures are the CPU architectures a platform may name: Go's
// GOARCH values for linux (wasm aside). KubeVirt itself builds for amd64,
// arm64 and s390x.
var architectures = []string{"386", "amd64", "arm", "arm64", "loong64", "mips", "mipsle", "mips64", "mips64le", "ppc64", "ppc64le", "riscv64", "s390x"}

// variants are the variants a platform may name per architecture, as the
// OCI image spec and containerd's platform matcher know them; the other
// architectures have none.
var variants = map[string][]string{
	"amd64": {"v1", "v2", "v3", "v4"},
	"arm":   {"v5", "v6", "v7", "v8"},
	"arm64": {"v8", "v9"},
}

// defaultVariant is the variant an architecture means when it names none
// (containerd's normalisation): linux/arm64 is linux/arm64/v8.
var defaultVariant = map[string]string{"amd64": "v1", "arm": "v7", "arm64": "v8"}

// misspelled are architecture names of other vocabularies (uname, RPM,
// Debian) and the GOARCH value that names the same architecture.
var misspelled = map[string]string{
	"x86_64": "amd64", "x86-64": "amd64", "x64": "amd64", "aarch64": "arm64", "armhf": "arm", "armv7l": "arm",
	"i386": "386", "i686": "386", "x86": "386", "ppc64el": "ppc64le", "riscv": "riscv64",
}

// ParsePlatform parses "os/arch[/variant]" (crane's --platform, the form
// of go-containerregistry's v1.ParsePlatform) and checks it: the OS must
// be linux, where KubeVirt runs; the architecture one of Go's GOARCH
// values for linux (wasm aside); the variant one that architecture has.
// An OS version (":10.0.17763") only exists for Windows images and is
// refused.
func ParsePlatform(s string) (Platform, error) {
	if strings.Contains(s, ":") {
		return Platform{}, fmt.Errorf("platform %q: an OS version (\":...\") only exists for windows images; give os/arch[/variant]", s)
	}
	parts := strings.Split(s, "/")
	if len(parts) < 2 || len(parts) > 3 || slices.Contains(parts, "") {
		return Platform{}, fmt.Errorf("platform %q is not os/arch[/variant], e.g. linux/arm64", s)
	}
	p := Platform{OS: parts[0], Architecture: parts[1]}
	if len(parts) == 3 {
		p.Variant = parts[2]
	}
	return p, p.validate()
}

// validate checks p as ParsePlatform does.
func (p Platform) validate() error {
	if p.OS != "linux" {
		return fmt.Errorf("platform %q: the OS must be linux, the OS of the nodes KubeVirt runs VMs on (the guest's own OS does not matter: a Windows guest's disk is linux/amd64)", p)
	}
	if !slices.Contains(architectures, p.Architecture) {
		if goarch, ok := misspelled[strings.ToLower(p.Architecture)]; ok {
			return fmt.Errorf("platform %q: unknown architecture %q; did you mean linux/%s?", p, p.Architecture, goarch)
		}
		return fmt.Errorf("platform %q: unknown architecture %q (one of %s)", p, p.Architecture, strings.Join(architectures, ", "))
	}
	if p.Variant != "" && !slices.Contains(variants[p.Architecture], p.Variant) {
		if len(variants[p.Architecture]) == 0 {
			return fmt.Errorf("platform %q: %s has no variants", p, p.Architecture)
		}
		return fmt.Errorf("platform %q: unknown variant %q of %s (one of %s)", p, p.Variant, p.Architecture, strings.Join(variants[p.Architecture], ", "))
	}
	return nil
}

// normalVariant is v, or the variant arch means when v is empty.
func normalVariant(arch, v string) string {
	if v == "" {
		return defaultVariant[arch]
	}
	return v
}

// matches reports whether an index entry's platform q is p: the same OS
// and architecture and, when p names a variant, the same variant (an
// empty variant meaning the architecture's default one). A p without a
// variant matches every variant of its architecture.
func (p Platform) matches(q *v1.Platform) bool {
	if q == nil || q.OS != p.OS || q.Architecture != p.Architecture {
		return false
	}
	return p.Variant == "" || normalVariant(p.Architecture, p.Variant) == normalVariant(q.Architecture, q.Variant)
}

// samePlatform reports whether two index entries are for one platform, so
// that an index holding both would be ambiguous: the same OS and
// architecture and the same variant, empty meaning the default one.
func samePlatform(a, b *v1.Platform) bool {
	return a != nil && b != nil && a.OS == b.OS && a.Architecture == b.Architecture &&
		normalVariant(a.Architecture, a.Variant) == normalVariant(b.Architecture, b.Variant)
}

// agrees reports whether an image config's platform cfg agrees with the
// platform an index entry claims for it: every field the config sets is
// the entry's. A config that sets none says nothing to contradict.
func agrees(entry *v1.Platform, cfg *v1.ConfigFile) bool {
	if cfg.OS != "" && cfg.OS != entry.OS {
		return false
	}
	if cfg.Architecture != "" && cfg.Architecture != entry.Architecture {
		return false
	}
	return cfg.Variant == "" || normalVariant(cfg.Architecture, cfg.Variant) == normalVariant(entry.Architecture, entry.Variant)
}

// platformString is how a report names an index entry's platform;
// "unknown" for an entry without one (an attestation, an artifact).
func platformString(p *v1.Platform) string {
	if p == nil || p.OS == "" || p.Architecture == "" {
		return "unknown"
	}
	return Platform{OS: p.OS, Architecture: p.Architecture, Variant: p.Variant}.String()
}
