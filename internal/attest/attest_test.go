package attest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"strings"
	"testing"

	"github.com/secure-systems-lab/go-securesystemslib/encrypted"
)

const (
	subjectA = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	subjectB = "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	predType = "https://imagepipe.io/test/v1"
)

func newKey(t *testing.T, kind string) crypto.Signer {
	t.Helper()
	switch kind {
	case "p256":
		k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		return k
	case "p384":
		k, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
		return k
	}
	_, k, _ := ed25519.GenerateKey(rand.Reader)
	return k
}

func signer(t *testing.T, key crypto.Signer) *Signer {
	t.Helper()
	s, err := NewSigner(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func verifier(t *testing.T, keys ...crypto.Signer) *Verifier {
	t.Helper()
	var pubs []crypto.PublicKey
	for _, k := range keys {
		pubs = append(pubs, k.Public())
	}
	v, err := NewVerifier(pubs)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func signStatement(t *testing.T, s *Signer, subject, predicateType, predicate string) []byte {
	t.Helper()
	b, err := s.Sign(t.Context(), Statement{Subject: subject, SubjectName: "acme/rhel", PredicateType: predicateType, Predicate: json.RawMessage(predicate)})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestSignVerify: what a key signs verifies with that key among others,
// for each supported algorithm, and carries the predicate through.
func TestSignVerify(t *testing.T) {
	for _, kind := range []string{"p256", "p384", "ed25519"} {
		key, other := newKey(t, kind), newKey(t, "p256")
		b := signStatement(t, signer(t, key), subjectA, predType, `{"verdict":"accepted"}`)
		got, err := verifier(t, other, key).Verify(b, subjectA, predType)
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		var pred struct{ Verdict string }
		if err := json.Unmarshal(got.Predicate, &pred); err != nil || pred.Verdict != "accepted" {
			t.Errorf("%s: predicate %s, %v", kind, got.Predicate, err)
		}
		if id, _ := KeyID(key.Public()); got.KeyID != id {
			t.Errorf("%s: signed by %s, want %s", kind, got.KeyID, id)
		}
	}
}

// TestVerifyRefuses: another key, another subject, another predicate
// type, a changed payload or signature, and garbage are all refused as
// not verified.
func TestVerifyRefuses(t *testing.T) {
	key, stranger := newKey(t, "p256"), newKey(t, "p256")
	good := signStatement(t, signer(t, key), subjectA, predType, `{"verdict":"accepted"}`)
	v := verifier(t, key)

	var env map[string]any
	json.Unmarshal(good, &env)
	dsse := env["dsseEnvelope"].(map[string]any)
	tamper := func(field, value string) []byte {
		c := map[string]any{}
		for k, val := range dsse {
			c[k] = val
		}
		c[field] = value
		out := map[string]any{}
		for k, val := range env {
			out[k] = val
		}
		out["dsseEnvelope"] = c
		b, _ := json.Marshal(out)
		return b
	}
	otherPayload := signStatement(t, signer(t, key), subjectA, predType, `{"verdict":"rejected"}`)
	var env2 map[string]any
	json.Unmarshal(otherPayload, &env2)
	swappedPayload := tamper("payload", env2["dsseEnvelope"].(map[string]any)["payload"].(string))

	cases := map[string]struct {
		bundle             []byte
		subject, predicate string
	}{
		"signed by a stranger":       {signStatement(t, signer(t, stranger), subjectA, predType, `{}`), subjectA, predType},
		"about another subject":      {good, subjectB, predType},
		"of another predicate type":  {good, subjectA, CosignSignPredicateType},
		"another payload, same sig":  {swappedPayload, subjectA, predType},
		"not JSON":                   {[]byte("garbage"), subjectA, predType},
		"over the size limit":        {append(good, make([]byte, MaxBundleSize)...), subjectA, predType},
		"a signature made of zeroes": {tamper("signatures", ""), subjectA, predType},
	}
	for name, c := range cases {
		if _, err := v.Verify(c.bundle, c.subject, c.predicate); !errors.Is(err, ErrNotVerified) {
			t.Errorf("%s: %v; want ErrNotVerified", name, err)
		}
	}
}

// TestLoadSigner reads PKCS#8, SEC 1 and cosign's encrypted keys, and
// refuses a wrong password and a public key.
func TestLoadSigner(t *testing.T) {
	key := newKey(t, "p256").(*ecdsa.PrivateKey)
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
