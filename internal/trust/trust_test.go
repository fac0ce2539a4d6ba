package trust

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"errors"
	"testing"

	"github.com/imagepipe/imagepipe/internal/attest"
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

func signStatement(t *testing.T, key crypto.Signer, subject, predicateType, predicate string) []byte {
	t.Helper()
	s, err := attest.NewSigner(key)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Sign(t.Context(), attest.Statement{Subject: subject, SubjectName: "acme/rhel", PredicateType: predicateType, Predicate: json.RawMessage(predicate)})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// checker is what both checks of a bundle offer.
type checker interface {
	Verify(bundle []byte, subject, predicateType string) (*attest.Verified, error)
}

// checkers are sigstore-go's check (what hubs trust) and the standard
// library's (what imagectl shows), trusting keys; every test below holds
// both to the same answers.
func checkers(t *testing.T, keys ...crypto.Signer) map[string]checker {
	t.Helper()
	var pubs []crypto.PublicKey
	for _, k := range keys {
		pubs = append(pubs, k.Public())
	}
	sg, err := NewVerifier(pubs)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := attest.NewKeyChecker(pubs)
	if err != nil {
		t.Fatal(err)
	}
	return map[string]checker{"sigstore-go": sg, "standard library": kc}
}

// TestSignVerify: what a key signs verifies with that key among others,
// for each supported algorithm, and carries the predicate through.
func TestSignVerify(t *testing.T) {
	for _, kind := range []string{"p256", "p384", "ed25519"} {
		key, other := newKey(t, kind), newKey(t, "p256")
		b := signStatement(t, key, subjectA, predType, `{"verdict":"accepted"}`)
		for name, c := range checkers(t, other, key) {
			got, err := c.Verify(b, subjectA, predType)
			if err != nil {
				t.Fatalf("%s, %s: %v", kind, name, err)
			}
			var pred struct{ Verdict string }
			if err := json.Unmarshal(got.Predicate, &pred); err != nil || pred.Verdict != "accepted" {
				t.Errorf("%s, %s: predicate %s, %v", kind, name, got.Predicate, err)
			}
			if id, _ := attest.KeyID(key.Public()); got.KeyID != id {
				t.Errorf("%s, %s: signed by %s, want %s", kind, name, got.KeyID, id)
			}
		}
	}
}

// TestVerifyRefuses: another key, another subject, another predicate
// type, a changed payload or signature, and garbage are all refused as
// not verified, by both checks.
func TestVerifyRefuses(t *testing.T) {
	key, stranger := newKey(t, "p256"), newKey(t, "p256")
	good := signStatement(t, key, subjectA, predType, `{"verdict":"accepted"}`)

	var env map[string]any
	json.Unmarshal(good, &env)
	dsse := env["dsseEnvelope"].(map[string]any)
	tamper := func(field string, value any) []byte {
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
	otherPayload := signStatement(t, key, subjectA, predType, `{"verdict":"rejected"}`)
	var env2 map[string]any
	json.Unmarshal(otherPayload, &env2)
	swappedPayload := tamper("payload", env2["dsseEnvelope"].(map[string]any)["payload"])
	twoSubjects := func() []byte {
		st, _ := json.Marshal(map[string]any{"_type": "https://in-toto.io/Statement/v1", "predicateType": predType, "predicate": map[string]any{},
			"subject": []any{map[string]any{"digest": map[string]string{"sha256": subjectA[7:]}}, map[string]any{"digest": map[string]string{"sha256": subjectB[7:]}}}})
		return st
	}

	cases := map[string]struct {
		bundle             []byte
		subject, predicate string
	}{
		"signed by a stranger":      {signStatement(t, stranger, subjectA, predType, `{}`), subjectA, predType},
		"about another subject":     {good, subjectB, predType},
		"of another predicate type": {good, subjectA, attest.CosignSignPredicateType},
		"another payload, same sig": {swappedPayload, subjectA, predType},
		"two subjects, unsigned":    {tamper("payload", twoSubjects()), subjectA, predType},
		"not JSON":                  {[]byte("garbage"), subjectA, predType},
		"over the size limit":       {append(good, make([]byte, attest.MaxBundleSize)...), subjectA, predType},
		"no signature":              {tamper("signatures", []any{}), subjectA, predType},
	}
	for name, c := range cases {
		for checkerName, ch := range checkers(t, key) {
			if _, err := ch.Verify(c.bundle, c.subject, c.predicate); !errors.Is(err, attest.ErrNotVerified) {
				t.Errorf("%s, %s: %v; want ErrNotVerified", name, checkerName, err)
			}
		}
	}
}
