package harness

import (
	"os"
	"os/exec"
	"path/filepath"

	"github.com/imagepipe/imagepipe/internal/attest"
	"github.com/imagepipe/imagepipe/internal/trust"
)

// CosignPassword protects the keys Cosign.KeyPair makes; imagectl reads
// it from $COSIGN_PASSWORD as cosign does.
const CosignPassword = "tenant-secret"

// Cosign is cosign (built by make tools), an independent client of the
// signatures and verdicts imagepipe writes and reads.
type Cosign struct{ Bin string }

// NewCosign finds cosign among the built tools.
func NewCosign(t T) *Cosign { return &Cosign{Bin: Binary(t, "cosign")} }

// KeyPair makes an encrypted key pair with cosign generate-key-pair and
// returns the paths of PREFIX.key and PREFIX.pub.
func (c *Cosign) KeyPair(t T, prefix string) (key, pub string) {
	t.Helper()
	c.run(t, "generate-key-pair", "--output-key-prefix", prefix)
	return prefix + ".key", prefix + ".pub"
}

// Sign signs ref with key as cosign sign --key does, without a
// transparency log (an empty signing config).
func (c *Cosign) Sign(t T, key, ref string) {
	t.Helper()
	config := filepath.Join(t.TempDir(), "signing-config.json")
	if err := os.WriteFile(config, []byte(`{"mediaType":"application/vnd.dev.sigstore.signingconfig.v0.2+json"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	c.run(t, "sign", "--key", key, "--signing-config", config, "--allow-http-registry=true", "-y", ref)
}

func (c *Cosign) run(t T, args ...string) {
	t.Helper()
	cmd := exec.Command(c.Bin, args...)
	cmd.Env = append(os.Environ(), "COSIGN_PASSWORD="+CosignPassword)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("cosign %s: %v\n%s", args[0], err, out)
	}
}

// TrustKeyFile is a checker trusting the PEM public keys of path, as a
// hub trusts its --gate-keys or the gate a tenant's key file.
func TrustKeyFile(t T, path string) *trust.Verifier {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := attest.ParsePublicKeys(data)
	if err != nil {
		t.Fatal(err)
	}
	v, err := trust.NewVerifier(keys)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
