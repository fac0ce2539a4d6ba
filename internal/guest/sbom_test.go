package guest

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	cdx "github.com/CycloneDX/cyclonedx-go"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/imagepipe/imagepipe/pkg/api"
)

// bomSchema compiles CycloneDX's JSON schema 1.5 as the cyclonedx-go
// module ships it (schema/, with the SPDX and JSF schemas it refers to).
// cyclonedx-go is a test dependency only: BOM writes the few types it
// needs itself, which costs imagectl 40 KB where cyclonedx-go's types
// cost 680 KB.
func bomSchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/CycloneDX/cyclonedx-go").Output()
	if err != nil {
		t.Fatalf("finding cyclonedx-go's module: %v", err)
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), "schema")
	c := jsonschema.NewCompiler()
	for file, id := range map[string]string{
		"bom-1.5.schema.json":   "http://cyclonedx.org/schema/bom-1.5.schema.json",
		"spdx.schema.json":      "http://cyclonedx.org/schema/spdx.schema.json",
		"jsf-0.82.schemax.json": "http://cyclonedx.org/schema/jsf-0.82.schema.json",
	} {
		f, err := os.Open(filepath.Join(dir, file))
		if err != nil {
			t.Fatal(err)
		}
		doc, err := jsonschema.UnmarshalJSON(f)
		f.Close()
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if err := c.AddResource(id, doc); err != nil {
			t.Fatal(err)
		}
	}
	c.AssertFormat()
	s, err := c.Compile("http://cyclonedx.org/schema/bom-1.5.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// checkBOM validates b against the schema, has cyclonedx-go (the
// reference Go reader) decode it to the same packages and purls, and
// returns it parsed.
func checkBOM(t *testing.T, s *jsonschema.Schema, b []byte) map[string]any {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Validate(doc); err != nil {
		t.Fatalf("the SBOM does not pass CycloneDX's schema 1.5: %v\n%s", err, b)
	}
	var ref cdx.BOM
	if err := cdx.NewBOMDecoder(bytes.NewReader(b), cdx.BOMFileFormatJSON).Decode(&ref); err != nil {
		t.Fatalf("cyclonedx-go does not read the SBOM: %v", err)
	}
	if ref.SpecVersion != cdx.SpecVersion1_5 || ref.Metadata == nil || ref.Metadata.Component == nil || ref.Components == nil || ref.Dependencies == nil {
		t.Fatalf("cyclonedx-go reads the SBOM as %+v", ref)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

const testDigest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// TestTheSBOMListsThePackagesWithTheirPURLs: the SBOM of a Debian guest
// passes CycloneDX's schema, names the image digest as its subject and
// the OS as an operating-system component, and lists each package with
// the purl scanners match advisories on; written twice, it is the same
// bytes (the gate signs it again from its record).
func TestTheSBOMListsThePackagesWithTheirPURLs(t *testing.T) {
	s := bomSchema(t)
	osr := &api.GuestOS{ID: "debian", VersionID: "12", PrettyName: "Debian GNU/Linux 12 (bookworm)"}
	pkgs := []Package{
		{Type: "deb", Name: "libc6", Version: "2.36-9+deb12u4", Arch: "amd64", Source: "glibc"},
		{Type: "deb", Name: "bash", Version: "5.2.15-2+b2", Arch: "amd64"},
		{Type: "deb", Name: "tzdata", Version: "1:2024a-0+deb12u1", Arch: "all"},
	}
	subject := BOMSubject{Digest: testDigest, Repository: "registry.example.com/acme/debian"}
	b, err := BOM(subject, osr, pkgs, "2026-11-29T20:00:00Z")
	if err != nil {
		t.Fatal(err)
	}
	again, err := BOM(subject, osr, pkgs, "2026-11-29T20:00:00Z")
	if err != nil || !bytes.Equal(b, again) {
		t.Errorf("the SBOM written twice differs (%v)", err)
	}
	m := checkBOM(t, s, b)
	if m["bomFormat"] != "CycloneDX" || m["specVersion"] != "1.5" || !strings.HasPrefix(m["serialNumber"].(string), "urn:uuid:") {
		t.Errorf("the SBOM's header: %v %v %v", m["bomFormat"], m["specVersion"], m["serialNumber"])
	}
	meta := m["metadata"].(map[string]any)
	top := meta["component"].(map[string]any)
	if top["type"] != "container" || top["version"] != testDigest || top["purl"] != "pkg:oci/debian@sha256:"+testDigest[7:]+"?repository_url=registry.example.com%2Facme%2Fdebian" {
		t.Errorf("the SBOM's subject: %v", top)
	}
	want := map[string]string{
		"os":     "debian 12",
		"libc6":  "pkg:deb/debian/libc6@2.36-9%2Bdeb12u4?arch=amd64&distro=debian-12&upstream=glibc",
		"bash":   "pkg:deb/debian/bash@5.2.15-2%2Bb2?arch=amd64&distro=debian-12",
		"tzdata": "pkg:deb/debian/tzdata@1:2024a-0%2Bdeb12u1?arch=all&distro=debian-12",
	}
	comps := m["components"].([]any)
	if len(comps) != len(want) {
		t.Fatalf("%d components; want %d", len(comps), len(want))
	}
	for _, c := range comps {
		c := c.(map[string]any)
		if c["type"] == "operating-system" {
			if got := c["name"].(string) + " " + c["version"].(string); got != want["os"] {
				t.Errorf("the OS component: %q", got)
			}
			continue
		}
		if got := c["purl"]; got != want[c["name"].(string)] {
			t.Errorf("%s: purl %q; want %q", c["name"], got, want[c["name"].(string)])
		}
		props, _ := c["properties"].([]any)
		if c["name"] == "libc6" && (len(props) != 1 || props[0].(map[string]any)["name"] != "aquasecurity:trivy:SrcName" || props[0].(map[string]any)["value"] != "glibc") {
			t.Errorf("libc6's source package, for Trivy: %v", props)
		}
	}

	// A file's SBOM names the file.
	b, err = BOM(BOMSubject{Digest: testDigest, Name: "disk.qcow2"}, nil, pkgs[:1], "")
	if err != nil {
		t.Fatal(err)
	}
	m = checkBOM(t, s, b)
	if top := m["metadata"].(map[string]any)["component"].(map[string]any); top["type"] != "file" || top["name"] != "disk.qcow2" {
		t.Errorf("a file's SBOM: %v", top)
	}
}

// TestHostilePackagesKeepTheirPURLsApart: names, versions and sources
// with the characters a purl separates its parts with are percent-encoded,
// so that no package reads as another (a scanner parses the purl back to
// the same name and version); fields over their bound leave the package
// out, counted; too many packages or too large a document is no SBOM.
func TestHostilePackagesKeepTheirPURLsApart(t *testing.T) {
	s := bomSchema(t)
	osr := &api.GuestOS{ID: "deb/ian?x", VersionID: "12 a"}
	hostile := []Package{
		{Type: "deb", Name: "evil@1.0?arch=amd64#x", Version: "1.0/../2 @?&=", Arch: "am d64", Source: "src&upstream=other"},
		{Type: "rpm", Name: "nss", Version: "3.90-1.el9", Epoch: "1", Arch: "x86_64", Source: "nss-3.90-1.el9.src.rpm"},
		{Type: "deb", Name: "long", Version: strings.Repeat("9", maxPackageField+1)},
	}
	b, err := BOM(BOMSubject{Digest: testDigest, Repository: "r.example/acme/x"}, osr, hostile, "")
	if err != nil {
		t.Fatal(err)
	}
	m := checkBOM(t, s, b)
	var purls []string
	for _, c := range m["components"].([]any) {
		if p, ok := c.(map[string]any)["purl"].(string); ok {
			purls = append(purls, p)
		}
	}
	want := []string{
		"pkg:deb/deb%2Fian%3Fx/evil%401.0%3Farch%3Damd64%23x@1.0%2F..%2F2%20%40%3F%26%3D?arch=am%20d64&distro=deb%2Fian%3Fx-12%20a&upstream=src%26upstream%3Dother",
		"pkg:rpm/deb%2Fian%3Fx/nss@3.90-1.el9?arch=x86_64&distro=deb%2Fian%3Fx-12%20a&epoch=1&upstream=nss-3.90-1.el9.src.rpm",
	}
	if strings.Join(purls, "\n") != strings.Join(want, "\n") {
		t.Errorf("purls\n%s\nwant\n%s", strings.Join(purls, "\n"), strings.Join(want, "\n"))
	}
	// Each purl parses back, as a URL, to the fields it was made of.
	u, err := url.Parse(purls[0])
	if err != nil {
		t.Fatal(err)
	}
	at := strings.LastIndex(u.Opaque, "@")
	name, _ := url.PathUnescape(u.Opaque[strings.LastIndex(u.Opaque[:at], "/")+1 : at])
	version, _ := url.PathUnescape(u.Opaque[at+1:])
	if name != hostile[0].Name || version != hostile[0].Version || u.Query().Get("upstream") != hostile[0].Source || len(u.Query()["upstream"]) != 1 {
		t.Errorf("the hostile purl reads back as %q@%q upstream %q", name, version, u.Query()["upstream"])
	}
	props, _ := m["metadata"].(map[string]any)["properties"].([]any)
	if len(props) != 1 || props[0].(map[string]any)["value"] != "1" {
		t.Errorf("the package with a field over its bound is not counted as left out: %v", props)
	}

	many := make([]Package, maxPackages+1)
	for i := range many {
		many[i] = Package{Type: "deb", Name: "p", Version: "1"}
	}
	if _, err := BOM(BOMSubject{Digest: testDigest, Name: "f"}, nil, many, ""); !errors.Is(err, ErrBOMTooLarge) {
		t.Errorf("%d packages: %v; want ErrBOMTooLarge", len(many), err)
	}
	large := make([]Package, MaxBOMSize/(2*maxPackageField)+1) // each name twice: its own and its purl
	for i := range large {
		large[i] = Package{Type: "deb", Name: strings.Repeat("n", maxPackageField), Version: "1"}
	}
	if _, err := BOM(BOMSubject{Digest: testDigest, Name: "f"}, nil, large, ""); !errors.Is(err, ErrBOMTooLarge) {
		t.Errorf("a document over %d bytes: %v; want ErrBOMTooLarge", MaxBOMSize, err)
	}
}

// FuzzPackageURL: any package fields give a purl that net/url, an
// independent parser, reads back to exactly those fields (one type, one
// namespace, one name, one version, each qualifier once), and an SBOM
// that is valid JSON.
func FuzzPackageURL(f *testing.F) {
	f.Add("libc6", "2.36-9+deb12u4", "", "amd64", "glibc", "debian", "12")
	f.Add("evil@1?arch=x#y", "1.0/../2 @?&=", "1", "am d64", "s&upstream=o", "deb/ian", "1 2")
	f.Add("\x00\xff%", "%41", "", "", "", "", "")
	f.Fuzz(func(t *testing.T, name, version, epoch, arch, source, id, versionID string) {
		if name == "" || version == "" {
			return
		}
		p := Package{Type: "rpm", Name: name, Version: version, Epoch: epoch, Arch: arch, Source: source}
		osr := &api.GuestOS{ID: id, VersionID: versionID}
		u, err := url.Parse(PackageURL(p, osr))
		if err != nil {
			t.Fatalf("%q: %v", PackageURL(p, osr), err)
		}
		path := strings.Split(u.Opaque, "/")
		wantParts := 2
		if id != "" {
			wantParts = 3
		}
		if u.Scheme != "pkg" || len(path) != wantParts || path[0] != "rpm" || u.Fragment != "" || strings.Count(path[len(path)-1], "@") != 1 {
			t.Fatalf("%q parses as %q / %q", PackageURL(p, osr), u.Scheme, u.Opaque)
		}
		gotName, gotVersion, _ := strings.Cut(path[len(path)-1], "@")
		if n, _ := url.PathUnescape(gotName); n != name {
			t.Errorf("name %q reads back as %q", name, n)
		}
		if v, _ := url.PathUnescape(gotVersion); v != version {
			t.Errorf("version %q reads back as %q", version, v)
		}
		if id != "" {
			if ns, _ := url.PathUnescape(path[1]); ns != id {
				t.Errorf("namespace %q reads back as %q", id, ns)
			}
		}
		q, err := url.ParseQuery(u.RawQuery)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{"arch": arch, "epoch": epoch, "upstream": source}
		if id != "" && versionID != "" {
			want["distro"] = id + "-" + versionID
		}
		for k, v := range want {
			if got := q[k]; v != "" && (len(got) != 1 || got[0] != v) || v == "" && len(got) != 0 {
				t.Errorf("qualifier %s=%q reads back as %q", k, v, got)
			}
		}
		if len(q) > len(want) {
			t.Errorf("qualifiers %v; want only %v", q, want)
		}
		b, err := BOM(BOMSubject{Digest: testDigest, Name: "f"}, osr, []Package{p}, "")
		if err != nil || !json.Valid(b) {
			t.Errorf("BOM: %v, valid JSON %v", err, json.Valid(b))
		}
	})
}
