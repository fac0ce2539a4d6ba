package registry

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/internal/trust"
	"github.com/imagepipe/imagepipe/internal/verdict"
	"github.com/imagepipe/imagepipe/pkg/api"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// TestSignaturesReadBothWays: a tenant signs with a key made by cosign
// (encrypted, its password in COSIGN_PASSWORD), with imagectl import
// --sign-key and with imagectl sign; cosign verify --key accepts both
// signatures, and imagepipe's reader accepts a signature cosign sign made.
// A signature is a statement about one digest: another digest, or another
// key ring, finds none.
func TestSignaturesReadBothWays(t *testing.T) {
	testenv.RequireQEMU(t)
	cosign := harness.NewCosign(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{})
	env := []string{"COSIGN_PASSWORD=" + harness.CosignPassword, "IMAGEPIPE_CACHE=" + t.TempDir()}
	key, pub := cosign.KeyPair(t, filepath.Join(t.TempDir(), "cosign"))

	disk := makeDisk(t, t.TempDir(), 16, 2, "raw")
	imported := testenv.RunCommand(t, testenv.Command{Name: testenv.Imagectl, Env: env,
		Args: []string{"import", "--quiet", "--sign-key", key, disk, reg.Host + "/acme/signed:1"}})
	if imported.Code != 0 {
		t.Fatalf("imagectl import --sign-key: exit %d\n%s", imported.Code, imported.Stderr)
	}
	other := makeDisk(t, t.TempDir(), 16, 3, "raw")
	importOK(t, t.TempDir(), other, reg.Host+"/acme/later:1")
	signed := testenv.RunCommand(t, testenv.Command{Name: testenv.Imagectl, Env: env, Args: []string{"sign", "--key", key, reg.Host + "/acme/later:1"}})
	if signed.Code != 0 {
		t.Fatalf("imagectl sign: exit %d\n%s", signed.Code, signed.Stderr)
	}
	for _, ref := range []string{"acme/signed:1", "acme/later:1"} {
		r := testenv.RunCommand(t, testenv.Command{Name: cosign.Bin, Args: []string{"verify", "--key", pub, "--insecure-ignore-tlog=true", "--allow-http-registry=true", reg.Host + "/" + ref}})
		if r.Code != 0 {
			t.Errorf("cosign verify %s: exit %d\n%s", ref, r.Code, r.Stderr)
		}
	}

	// cosign sign, without a transparency log, and imagepipe's reader.
	cosignSigned := reg.Host + "/acme/bycosign:1"
	importOK(t, t.TempDir(), makeDisk(t, t.TempDir(), 16, 4, "raw"), cosignSigned)
	cosign.Sign(t, key, cosignSigned)
	tenant := harness.TrustKeyFile(t, pub)
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	stranger, _ := trust.NewVerifier([]crypto.PublicKey{k.Public()})
	rc, err := registry.New(registry.WithCacheDir(""))
	if err != nil {
		t.Fatal(err)
	}
	for _, ref := range []string{cosignSigned, reg.Host + "/acme/signed:1", reg.Host + "/acme/later:1"} {
		d := digestOf(t, rc, ref)
		if _, err := verdict.FindSignature(t.Context(), rc, tenant, d, ""); err != nil {
			t.Errorf("%s: %v; want the tenant's signature found", ref, err)
		}
		if _, err := verdict.FindSignature(t.Context(), rc, stranger, d, ""); !errors.Is(err, verdict.ErrNotSigned) {
			t.Errorf("%s with another key ring: %v; want not signed", ref, err)
		}
	}
	unsigned := reg.Host + "/acme/unsigned:1"
	importOK(t, t.TempDir(), makeDisk(t, t.TempDir(), 16, 5, "raw"), unsigned)
	if _, err := verdict.FindSignature(t.Context(), rc, tenant, digestOf(t, rc, unsigned), ""); !errors.Is(err, verdict.ErrNotSigned) {
		t.Errorf("an unsigned image: %v; want not signed", err)
	}
}

// digestOf is the digest ref's tag points at.
// tenantKey writes a new P-256 tenant key as a PEM file for imagectl sign
// --key and returns it with the file's path.
func tenantKey(t *testing.T) (*ecdsa.PrivateKey, string) {
	t.Helper()
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	key := filepath.Join(t.TempDir(), "tenant.key")
	if err := os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return k, key
}

func digestOf(t *testing.T, rc *registry.Client, ref string) name.Digest {
	t.Helper()
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := rc.FetchManifest(t.Context(), tag)
	if err != nil {
		t.Fatal(err)
	}
	return tag.Context().Digest(raw.Digest)
}

// TestSignatureLostFromTheReferrersTag: on a registry without the
// referrers API, a writer extending the referrers tag at the same time as
// another can drop the other's entry. A signature whose push was announced
// still counts when the gate is told its digest, and only then.
func TestSignatureLostFromTheReferrersTag(t *testing.T) {
	testenv.RequireQEMU(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{})
	k, key := tenantKey(t)
	ref := reg.Host + "/acme/lost:1"
	importOK(t, t.TempDir(), makeDisk(t, t.TempDir(), 16, 6, "raw"), ref)
	r := testenv.RunCommand(t, testenv.Command{Name: testenv.Imagectl, Args: []string{"sign", "--key", key, "-o", "json", ref}})
	var signed api.SignResult
	if r.Code != 0 || json.Unmarshal([]byte(r.Stdout), &signed) != nil {
		t.Fatalf("imagectl sign: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	rc, err := registry.New(registry.WithCacheDir(""))
	if err != nil {
		t.Fatal(err)
	}
	subject := digestOf(t, rc, ref)

	// The other writer's index, read before the signature was added.
	tag := subject.Context().Tag(strings.Replace(subject.DigestStr(), ":", "-", 1))
	empty := []byte(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[]}`)
	if _, err := rc.Push(t.Context(), tag, registry.RawManifest{MediaType: types.MediaType(ocispec.MediaTypeImageIndex), Bytes: empty}); err != nil {
		t.Fatal(err)
	}
	tenant, _ := trust.NewVerifier([]crypto.PublicKey{k.Public()})
	if _, err := verdict.FindSignature(t.Context(), rc, tenant, subject, ""); !errors.Is(err, verdict.ErrNotSigned) {
		t.Fatalf("the listing without the signature: %v; want not signed", err)
	}
	if id, err := verdict.FindSignature(t.Context(), rc, tenant, subject, signed.Signature); err != nil || id != signed.KeyID {
		t.Errorf("told the signature's digest: key %q, %v; want %s", id, err, signed.KeyID)
	}
}

// TestReferrersTagReadDirectlyOnceTheAPIIsMissing: distribution has no
// referrers API. After its first 404, a client reads the referrers tag
// directly, and still finds what is attached there.
func TestReferrersTagReadDirectlyOnceTheAPIIsMissing(t *testing.T) {
	testenv.RequireQEMU(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{})
	_, key := tenantKey(t)
	ref := reg.Host + "/acme/direct:1"
	importOK(t, t.TempDir(), makeDisk(t, t.TempDir(), 16, 6, "raw"), ref)
	if r := testenv.RunCommand(t, testenv.Command{Name: testenv.Imagectl, Args: []string{"sign", "--key", key, ref}}); r.Code != 0 {
		t.Fatalf("imagectl sign: exit %d\n%s", r.Code, r.Stderr)
	}
	rc, err := registry.New(registry.WithCacheDir(""))
	if err != nil {
		t.Fatal(err)
	}
	subject := digestOf(t, rc, ref)
	apiCalls := func() int {
		data, err := os.ReadFile(reg.LogPath())
		if err != nil {
			t.Fatal(err)
		}
		return strings.Count(string(data), `"GET /v2/acme/direct/referrers/`+subject.DigestStr()+` HTTP`)
	}
	before := apiCalls()
	for i := range 3 {
		refs, _, err := rc.Referrers(t.Context(), subject, "")
		if err != nil || len(refs) != 1 {
			t.Fatalf("listing %d: %d referrers, %v; want the signature", i+1, len(refs), err)
		}
	}
	if n := apiCalls() - before; n != 1 {
		t.Errorf("the referrers API was asked %d times in three listings; want once, then the referrers tag directly", n)
	}
}

// TestReferrersAPIStaysInUseAfterAnUnknownRepository: zot serves the
// referrers API and answers it with 404 NAME_UNKNOWN for a repository it
// does not hold. That answer must not make a client read the referrers tag
// from then on: zot keeps no such tag, and every attachment (a verdict, a
// signature) would go unseen.
func TestReferrersAPIStaysInUseAfterAnUnknownRepository(t *testing.T) {
	z := harness.StartZot(t, harness.ZotOptions{
		Users:  map[string]string{"pusher": "pusher-pw"},
		Access: map[string]map[string][]string{"**": {"pusher": {"read", "create", "update", "delete"}}},
	})
	rc, err := registry.New(registry.WithCacheDir(""), registry.WithBasicAuth("pusher", "pusher-pw"))
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON),
		static.NewLayer([]byte("held"), types.OCILayer))
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.ParseReference(z.Host + "/acme/held:1")
	if err != nil {
		t.Fatal(err)
	}
	subject, err := rc.Push(t.Context(), ref, img)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := rc.FetchManifest(t.Context(), subject)
	if err != nil {
		t.Fatal(err)
	}
	desc := ocispec.Descriptor{MediaType: string(raw.MediaType), Digest: digest.Digest(raw.Digest), Size: int64(len(raw.Bytes))}
	if _, err := verdict.Attach(t.Context(), rc, subject, desc, verdict.Artifact{ArtifactType: "application/vnd.example.note", MediaType: "text/plain", Content: []byte("note")}); err != nil {
		t.Fatal(err)
	}

	if refs, _, err := rc.Referrers(t.Context(), subject, ""); err != nil || len(refs) != 1 {
		t.Fatalf("referrers of the pushed image: %d, %v; want the one attached", len(refs), err)
	}
	unknown, err := name.NewDigest(z.Host + "/acme/never-pushed@" + subject.DigestStr())
	if err != nil {
		t.Fatal(err)
	}
	if refs, _, err := rc.Referrers(t.Context(), unknown, ""); err != nil || len(refs) != 0 {
		t.Fatalf("referrers in a repository zot does not hold: %v, %v; want none", refs, err)
	}
	refs, _, err := rc.Referrers(t.Context(), subject, "")
	if err != nil || len(refs) != 1 {
		t.Errorf("referrers of the pushed image after the unknown repository's 404: %d, %v; want the one attached", len(refs), err)
	}
}
