package hostile

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/imagepipe/imagepipe/internal/attest"
	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/internal/verdict"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// hostileStanzas are dpkg packages whose names, versions and sources hold
// what a package URL separates its parts with.
const hostileStanzas = `
Package: evil@1.0?arch=i386#x
Status: install ok installed
Architecture: amd64
Source: src&upstream=other (1)
Version: 1.0/../2 @?&=
`

// sbomDisk is a raw ext4 disk, made by mkfs.ext4, holding Debian 12's
// os-release and this machine's dpkg database with hostileStanzas added.
func sbomDisk(t *testing.T) []byte {
	t.Helper()
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	if err := os.MkdirAll(filepath.Join(root, "var/lib/dpkg"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	status, err := os.ReadFile("/var/lib/dpkg/status")
	if err != nil {
		t.Fatal(err)
	}
	status = append(bytes.TrimRight(status, "\n"), "\n"+hostileStanzas...)
	for path, text := range map[string][]byte{
		"etc/os-release":      []byte("PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nVERSION_ID=\"12\"\nID=debian\n"),
		"var/lib/dpkg/status": status,
	} {
		if err := os.WriteFile(filepath.Join(root, path), text, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	disk := filepath.Join(dir, "disk.raw")
	testenv.Run(t, "truncate", "-s", "32M", disk)
	testenv.Run(t, "mkfs.ext4", "-q", "-F", "-d", root, disk)
	b, err := os.ReadFile(disk)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestTheGuestsSBOMIsACosignAttestation: an image whose guest lists
// dpkg packages, pushed by another client to a registry with image-gate,
// gets a CycloneDX SBOM attestation signed by the gate's key:
// `cosign verify-attestation --type cyclonedx` accepts it with the
// provider's key and refuses it with another, and `imagectl inspect
// --sbom` writes it, every installed package with its purl. imagectl
// refuses, and writes nothing for, an SBOM signed by another key, one
// about another image, and one over its size bound, which it does not
// download.
func TestTheGuestsSBOMIsACosignAttestation(t *testing.T) {
	reg := harness.StartRegistry(t, harness.RegistryOptions{Gate: testenv.ImageGate})
	rc, err := registry.New(registry.WithCacheDir(""))
	if err != nil {
		t.Fatal(err)
	}
	trust := providerTrust(t)
	ref, err := name.NewTag(reg.Host+"/acme/sbom:1", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	subject := ref.Context().Digest(pushContainerDisk(t, ref, sbomDisk(t)))
	if v := awaitVerdict(t, rc, trust, subject, "the Debian image"); v.Verdict != "accepted" || v.Images[0].Guest == nil || v.Images[0].Guest.Packages == nil {
		t.Fatalf("the verdict: %+v", v)
	}
	installed := 0
	sc := bufio.NewScanner(bytes.NewReader(testenv.Run(t, "dpkg-query", "-W", "-f", "${db:Status-Abbrev}\n")))
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "ii") {
			installed++
		}
	}
	installed++ // the hostile one

	// cosign, an independent client: the SBOM is a CycloneDX attestation
	// of the pushed digest, signed by the provider's key.
	_, pub := harness.ProviderKeyFiles(t)
	other := filepath.Join(t.TempDir(), "other.pub")
	testenv.Run(t, "sh", "-c", fmt.Sprintf("openssl ecparam -name prime256v1 -genkey -noout | openssl pkey -pubout -out %s", other))
	cosign := harness.Binary(t, "cosign")
	args := []string{"verify-attestation", "--insecure-ignore-tlog=true", "--allow-http-registry=true", "--type", "cyclonedx"}
	r := testenv.RunCommand(t, testenv.Command{Name: cosign, Args: append(args, "--key", pub, subject.String())})
	if r.Code != 0 || !strings.Contains(r.Stdout, "payload") {
		t.Fatalf("cosign verify-attestation --type cyclonedx: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	t.Logf("cosign verify-attestation --type cyclonedx --key gate.pub %s:\n%s", subject, r.Stderr)
	var env struct{ Payload []byte }
	if err := json.Unmarshal([]byte(strings.SplitN(r.Stdout, "\n", 2)[0]), &env); err != nil {
		t.Fatalf("cosign's output: %v\n%s", err, r.Stdout)
	}
	var st struct {
		PredicateType string
		Subject       []struct{ Digest map[string]string }
	}
	if err := json.Unmarshal(env.Payload, &st); err != nil || st.PredicateType != attest.CycloneDXPredicateType || len(st.Subject) != 1 || "sha256:"+st.Subject[0].Digest["sha256"] != subject.DigestStr() {
		t.Errorf("cosign verified the statement %s (%v)", env.Payload, err)
	}
	if r := testenv.RunCommand(t, testenv.Command{Name: cosign, Args: append(args, "--key", other, subject.String())}); r.Code == 0 {
		t.Errorf("cosign accepted the SBOM with another key")
	}

	// imagectl writes it: every installed package with its purl, the
	// hostile one's parts percent-encoded.
	out := filepath.Join(t.TempDir(), "sbom.json")
	r = testenv.RunCommand(t, testenv.Command{Name: testenv.Imagectl, Args: []string{"inspect", "--gate-keys", pub, "--sbom", out, "docker://" + ref.String()}})
	if r.Code != 0 || !strings.Contains(r.Stdout, "Debian GNU/Linux 12") {
		t.Fatalf("imagectl inspect --sbom: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var bom struct {
		BOMFormat  string
		Metadata   struct{ Component struct{ Version string } }
		Components []struct{ Type, Name, Purl string }
	}
	if err := json.Unmarshal(b, &bom); err != nil || bom.BOMFormat != "CycloneDX" || bom.Metadata.Component.Version != subject.DigestStr() {
		t.Fatalf("the SBOM written: %v\n%.300s", err, b)
	}
	libs := 0
	for _, c := range bom.Components {
		if c.Type == "library" {
			libs++
		}
		if c.Name == "libc6" && !strings.HasPrefix(c.Purl, "pkg:deb/debian/libc6@") {
			t.Errorf("libc6's purl: %s", c.Purl)
		}
		if strings.HasPrefix(c.Name, "evil") && c.Purl != "pkg:deb/debian/evil%401.0%3Farch%3Di386%23x@1.0%2F..%2F2%20%40%3F%26%3D?arch=amd64&distro=debian-12&upstream=src%26upstream%3Dother" {
			t.Errorf("the hostile package's purl: %s", c.Purl)
		}
	}
	if libs != installed {
		t.Errorf("the SBOM lists %d packages; dpkg-query says %d are installed (and one hostile)", libs, installed)
	}

	// Refused: another key; an SBOM about another image; one over the
	// bound, which imagectl does not download.
	if r := testenv.RunCommand(t, testenv.Command{Name: testenv.Imagectl, Args: []string{"inspect", "--gate-keys", other, "--sbom", filepath.Join(t.TempDir(), "x.json"), "docker://" + ref.String()}}); r.Code == 0 || !strings.Contains(r.Stderr, "no trusted key") {
		t.Errorf("imagectl inspect --sbom with another key: exit %d\n%s", r.Code, r.Stderr)
	}
	key, _ := harness.ProviderKeyFiles(t)
	keyPEM, err := os.ReadFile(key)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := attest.LoadSigner(keyPEM, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		predicate []byte
		about     string // the statement's subject; "" for the image's own
		want      string
		unread    bool // its bundle must not be downloaded
	}{
		{"about another image", b, subject.DigestStr(), "not about", false},
		{"over its bound", append(append([]byte(`{"bomFormat":"CycloneDX","x":"`), bytes.Repeat([]byte("a"), attest.MaxSBOMBundleSize)...), `"}`...), "", "over the limit", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			img, err := name.NewTag(reg.Host+"/acme/forged-"+strings.ReplaceAll(tc.name, " ", "-")+":1", name.Insecure)
			if err != nil {
				t.Fatal(err)
			}
			raw := []byte("random bytes, an accepted disk without a guest's packages")
			raw = append(raw, make([]byte, 1<<20-len(raw))...)
			target := img.Context().Digest(pushContainerDisk(t, img, raw))
			awaitVerdict(t, rc, trust, target, tc.name)
			about := target
			if tc.about != "" {
				about = img.Context().Digest(tc.about)
			}
			bundle, err := signer.Sign(t.Context(), attest.Statement{Subject: about.DigestStr(), PredicateType: attest.CycloneDXPredicateType, Predicate: tc.predicate})
			if err != nil {
				t.Fatal(err)
			}
			m, err := rc.FetchManifest(t.Context(), target)
			if err != nil {
				t.Fatal(err)
			}
			att, err := verdict.Attach(t.Context(), rc, target, ocispec.Descriptor{MediaType: string(m.MediaType), Digest: digest.Digest(m.Digest), Size: int64(len(m.Bytes))}, verdict.Artifact{
				ArtifactType: attest.BundleMediaType, MediaType: attest.BundleMediaType, Content: bundle,
				Annotations: map[string]string{verdict.PredicateTypeAnnotation: attest.CycloneDXPredicateType},
			})
			if err != nil {
				t.Fatal(err)
			}
			written := filepath.Join(t.TempDir(), "forged.json")
			r := testenv.RunCommand(t, testenv.Command{Name: testenv.Imagectl, Args: []string{"inspect", "--gate-keys", pub, "--sbom", written, "docker://" + img.String()}})
			if r.Code == 0 || !strings.Contains(r.Stderr, tc.want) {
				t.Errorf("imagectl inspect --sbom: exit %d; want a refusal saying %q\n%s", r.Code, tc.want, r.Stderr)
			}
			if _, err := os.Stat(written); !os.IsNotExist(err) {
				t.Errorf("imagectl wrote the refused SBOM (%v)", err)
			}
			if tc.unread {
				am, err := rc.FetchManifest(t.Context(), img.Context().Digest(att.Digest))
				if err != nil {
					t.Fatal(err)
				}
				var parsed ocispec.Manifest
				if err := json.Unmarshal(am.Bytes, &parsed); err != nil {
					t.Fatal(err)
				}
				if reads := blobGets(t, reg, img.Context().RepositoryStr(), parsed.Layers[0].Digest.String(), "imagectl/"); len(reads) != 0 {
					t.Errorf("imagectl downloaded the SBOM over its bound (%d times)", len(reads))
				}
			}
		})
	}
}

// blobGets returns the registry's completed GETs of repo's blob whose
// User-Agent contains agent.
func blobGets(t *testing.T, reg *harness.Registry, repo, blob, agent string) []string {
	t.Helper()
	var out []string
	for _, r := range registryRequests(t, reg, repo) {
		if r.method == "GET" && strings.Contains(r.line, "/v2/"+repo+"/blobs/"+blob) && strings.Contains(r.line, agent) {
			out = append(out, r.line)
		}
	}
	return out
}
