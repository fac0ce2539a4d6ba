package guest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/imagepipe/imagepipe/pkg/api"
)

// Bounds of an SBOM; docs/security.md lists them.
const (
	// MaxBOMSize bounds the CycloneDX JSON BOM writes: about 40,000
	// packages of usual names. A guest whose SBOM would be larger gets
	// none (ErrBOMTooLarge).
	MaxBOMSize = 12 << 20
	// maxPackageField bounds each field of a package an SBOM lists; a
	// package with a longer one is left out, and counted
	// (BOMPropertyOmitted).
	maxPackageField = 512
)

// ErrBOMTooLarge is matched by BOM's error when the document would pass
// MaxBOMSize.
var ErrBOMTooLarge = errors.New("the SBOM is over its size bound")

// BOMPropertyOmitted is the metadata property of a BOM counting the
// packages left out for a field over its bound.
const BOMPropertyOmitted = "imagepipe:packages:omitted"

// bomPropertySource is the property of a package naming its source
// package, as Trivy writes and reads it.
const bomPropertySource = "aquasecurity:trivy:SrcName"

// BOMSubject is what an SBOM describes: a pushed image (its manifest
// digest and repository) or a disk file (its SHA-256 and name).
type BOMSubject struct {
	// Digest is "sha256:..." of the image's manifest or of the file.
	Digest string
	// Repository, for an image, is REGISTRY/REPOSITORY; "" for a file.
	Repository string
	// Name names a file; for an image, the repository's last element is
	// used.
	Name string
}

// BOM writes the CycloneDX 1.5 JSON SBOM of a guest: subject as the
// metadata's component, the operating system osr names (nil: unknown) as
// a component of type operating-system, and each package as a library
// with its package URL (PackageURL) and its source package, the OS
// depending on them (the shape Trivy reads an image's OS packages in). Its
// serial number is derived from its content, and its timestamp is
// created ("" for none), so that the same guest and subject give the
// same bytes: the gate writes it again from its record without reading
// the disk again. At most maxPackages packages are listed; the document
// is at most MaxBOMSize bytes (else ErrBOMTooLarge).
func BOM(subject BOMSubject, osr *api.GuestOS, pkgs []Package, created string) ([]byte, error) {
	hexDigest, ok := strings.CutPrefix(subject.Digest, "sha256:")
	if !ok || len(hexDigest) != 64 {
		return nil, fmt.Errorf("the SBOM's subject %q is not a sha256 digest", subject.Digest)
	}
	if len(pkgs) > maxPackages {
		return nil, fmt.Errorf("%d packages, over the bound of %d: %w", len(pkgs), maxPackages, ErrBOMTooLarge)
	}
	top := bomComponent{BOMRef: "subject", Hashes: []bomHash{{Alg: "SHA-256", Content: hexDigest}}}
	if subject.Repository != "" {
		top.Type = "container"
		top.Name = subject.Repository
		top.Version = subject.Digest
		top.PURL = ociPURL(subject.Repository, subject.Digest)
	} else {
		top.Type, top.Name = "file", subject.Name
	}
	bom := &bomDocument{Schema: "http://cyclonedx.org/schema/bom-1.5.schema.json", BOMFormat: "CycloneDX", SpecVersion: "1.5", Version: 1}
	bom.Metadata = bomMetadata{Timestamp: created, Component: top,
		Tools: bomTools{Components: []bomComponent{{Type: "application", Name: "imagepipe"}}}}
	comps := make([]bomComponent, 0, len(pkgs)+1)
	deps := []bomDependency{{Ref: "subject"}}
	var osRef string
	if osr != nil && osr.ID != "" {
		osRef = "os"
		comps = append(comps, bomComponent{BOMRef: osRef, Type: "operating-system", Name: osr.ID, Version: osr.VersionID, Description: osr.PrettyName})
		deps[0].DependsOn = []string{osRef}
	}
	var refs []string
	omitted := 0
	for i, p := range pkgs {
		if slices.ContainsFunc([]string{p.Type, p.Name, p.Version, p.Epoch, p.Arch, p.Source}, func(f string) bool { return len(f) > maxPackageField }) || p.Name == "" {
			omitted++
			continue
		}
		ref := "pkg-" + strconv.Itoa(i)
		refs = append(refs, ref)
		c := bomComponent{BOMRef: ref, Type: "library", Name: p.Name, Version: p.Version, PURL: PackageURL(p, osr)}
		if p.Source != "" {
			// Advisories of Debian and Red Hat name source packages: Grype
			// reads the purl's upstream, Trivy this property.
			c.Properties = []bomProperty{{Name: bomPropertySource, Value: p.Source}}
		}
		comps = append(comps, c)
	}
	if osRef != "" {
		deps = append(deps, bomDependency{Ref: osRef, DependsOn: refs})
	} else if len(refs) > 0 {
		deps[0].DependsOn = refs
	}
	bom.Components, bom.Dependencies = comps, deps
	if omitted > 0 {
		bom.Metadata.Properties = []bomProperty{{Name: BOMPropertyOmitted, Value: strconv.Itoa(omitted)}}
	}
	body, err := encodeBOM(bom)
	if err != nil {
		return nil, err
	}
	if len(body) > MaxBOMSize {
		return nil, fmt.Errorf("%d bytes for %d packages, over the bound of %d: %w", len(body), len(pkgs), MaxBOMSize, ErrBOMTooLarge)
	}
	sum := sha256.Sum256(append([]byte(subject.Digest+"\x00"), body...))
	bom.SerialNumber = "urn:uuid:" + uuidOf(sum[:16])
	out, err := encodeBOM(bom)
	if err != nil {
		return nil, err
	}
	if len(out) > MaxBOMSize {
		return nil, fmt.Errorf("%d bytes for %d packages, over the bound of %d: %w", len(out), len(pkgs), MaxBOMSize, ErrBOMTooLarge)
	}
	return out, nil
}

// The parts of CycloneDX 1.5's JSON format BOM writes.
type (
	bomDocument struct {
		Schema       string          `json:"$schema"`
		BOMFormat    string          `json:"bomFormat"`
		SpecVersion  string          `json:"specVersion"`
		SerialNumber string          `json:"serialNumber,omitempty"`
		Version      int             `json:"version"`
		Metadata     bomMetadata     `json:"metadata"`
		Components   []bomComponent  `json:"components"`
		Dependencies []bomDependency `json:"dependencies"`
	}
	bomMetadata struct {
		Timestamp  string        `json:"timestamp,omitempty"`
		Tools      bomTools      `json:"tools"`
		Component  bomComponent  `json:"component"`
		Properties []bomProperty `json:"properties,omitempty"`
	}
	bomTools struct {
		Components []bomComponent `json:"components"`
	}
	bomComponent struct {
		BOMRef      string        `json:"bom-ref,omitempty"`
		Type        string        `json:"type"`
		Name        string        `json:"name"`
		Version     string        `json:"version,omitempty"`
		Description string        `json:"description,omitempty"`
		Hashes      []bomHash     `json:"hashes,omitempty"`
		PURL        string        `json:"purl,omitempty"`
		Properties  []bomProperty `json:"properties,omitempty"`
	}
	bomHash struct {
		Alg     string `json:"alg"`
		Content string `json:"content"`
	}
	bomDependency struct {
		Ref       string   `json:"ref"`
		DependsOn []string `json:"dependsOn,omitempty"`
	}
	bomProperty struct {
		Name  string `json:"name"`
		Value string `json:"value"`
	}
)

// encodeBOM is bom as compact JSON.
func encodeBOM(bom *bomDocument) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(bom); err != nil {
		return nil, fmt.Errorf("writing the SBOM: %w", err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// uuidOf formats 16 bytes as a version 4, variant 1 UUID (its bits are a
// hash of the BOM, not random: the same BOM has the same serial number).
func uuidOf(b []byte) string {
	u := slices.Clone(b[:16])
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	h := hex.EncodeToString(u)
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// PackageURL is p's package URL (purl), as scanners (Trivy, Grype) match
// it against advisories: pkg:TYPE/OS-ID/NAME@VERSION with the qualifiers
// arch, distro (ID-VERSION_ID of the os-release osr), epoch (rpm) and
// upstream (the source package, when named otherwise), each part
// percent-encoded.
func PackageURL(p Package, osr *api.GuestOS) string {
	var b strings.Builder
	b.WriteString("pkg:" + purlEscape(p.Type) + "/")
	q := map[string]string{"arch": p.Arch, "epoch": p.Epoch, "upstream": p.Source}
	if osr != nil && osr.ID != "" {
		b.WriteString(purlEscape(osr.ID) + "/")
		if osr.VersionID != "" {
			q["distro"] = osr.ID + "-" + osr.VersionID
		}
	}
	b.WriteString(purlEscape(p.Name))
	if p.Version != "" {
		b.WriteString("@" + purlEscape(p.Version))
	}
	sep := "?"
	for _, k := range []string{"arch", "distro", "epoch", "upstream"} { // sorted, as the spec asks
		if q[k] != "" {
			b.WriteString(sep + k + "=" + purlEscape(q[k]))
			sep = "&"
		}
	}
	return b.String()
}

// ociPURL is the package URL of the image digest in repository
// (REGISTRY/REPOSITORY): pkg:oci/NAME@DIGEST?repository_url=....
func ociPURL(repository, digest string) string {
	name := repository[strings.LastIndex(repository, "/")+1:]
	return "pkg:oci/" + purlEscape(name) + "@" + purlEscape(digest) + "?repository_url=" + purlEscape(repository)
}

// purlEscape percent-encodes s for a package URL: every byte but the
// unreserved ones (letters, digits, '.', '-', '_', '~') and ':', which
// the spec keeps as is.
func purlEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', strings.IndexByte(".-_~:", c) >= 0:
			b.WriteByte(c)
		default:
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}
