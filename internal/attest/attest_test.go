package attest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"strings"
	"testing"

	"github.com/secure-systems-lab/go-securesystemslib/encrypted"
)

// TestLoadSigner reads PKCS#8, SEC 1 and cosign's encrypted keys, and
// refuses a wrong password and a public key.
func TestLoadSigner(t *testing.T) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	pkcs8, _ := x509.MarshalPKCS8PrivateKey(key)
	sec1, _ := x509.MarshalECPrivateKey(key)
	enc, err := encrypted.Encrypt(pkcs8, []byte("s3cret"))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{
		"PKCS#8": pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8}),
		"SEC 1":  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: sec1}),
		"cosign": pem.EncodeToMemory(&pem.Block{Type: "ENCRYPTED SIGSTORE PRIVATE KEY", Bytes: enc}),
	}
	want, _ := KeyID(key.Public())
	for name, f := range files {
		s, err := LoadSigner(f, []byte("s3cret"))
		if err != nil || s.KeyID() != want {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := LoadSigner(files["cosign"], nil); !errors.Is(err, ErrPasswordNeeded) {
		t.Errorf("cosign key without a password: %v", err)
	}
	if _, err := LoadSigner(files["cosign"], []byte("wrong")); err == nil || !strings.Contains(err.Error(), "password") {
		t.Errorf("cosign key with the wrong password: %v", err)
	}
	pub, _ := MarshalPublicKey(key.Public())
	if _, err := LoadSigner(pub, nil); err == nil {
		t.Error("a public key was taken for a private one")
	}
	keys, err := ParsePublicKeys(append(pub, pub...))
	if err != nil || len(keys) != 2 {
		t.Errorf("a key ring of two: %d keys, %v", len(keys), err)
	}
}
