package attest

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Media and payload types of what this package writes.
const (
	// BundleMediaType is a sigstore bundle v0.3 as JSON: the media type of
	// the referrer's blob and its artifact type.
	BundleMediaType = "application/vnd.dev.sigstore.bundle.v0.3+json"
	// InTotoPayloadType is the DSSE payload type of an in-toto statement.
	InTotoPayloadType = "application/vnd.in-toto+json"
	// statementType is the in-toto statement version written.
	statementType = "https://in-toto.io/Statement/v1"
	// CosignSignPredicateType is the predicate type of a cosign 3 image
	// signature (`cosign sign --key`): an empty predicate.
	CosignSignPredicateType = "https://sigstore.dev/cosign/sign/v1"
	// CycloneDXPredicateType is the predicate type of a CycloneDX SBOM,
	// as `cosign attest --type cyclonedx` writes it and
	// `cosign verify-attestation --type cyclonedx` looks for it.
	CycloneDXPredicateType = "https://cyclonedx.org/bom"
)

// Bounds of a bundle this package reads (MaxBundleSizeOf).
const (
	// MaxBundleSize bounds a bundle: a key-signed bundle of a verdict or
	// a signature is a few KiB.
	MaxBundleSize = 256 << 10
	// MaxSBOMBundleSize bounds a bundle of a CycloneDX SBOM: the
	// guest's SBOM (internal/guest.MaxBOMSize, 12 MiB) in base64, and
	// the envelope.
	MaxSBOMBundleSize = 17 << 20
)

// MaxBundleSizeOf is the bound of a bundle of predicateType: readers
// download and check no more.
func MaxBundleSizeOf(predicateType string) int64 {
	if predicateType == CycloneDXPredicateType {
		return MaxSBOMBundleSize
	}
	return MaxBundleSize
}

// ErrNotVerified is matched by every error of a Checker that says the
// bundle does not prove what was asked.
var ErrNotVerified = errors.New("not verified")

// Verified is a statement whose signature checked out.
type Verified struct {
	// KeyID identifies the trusted key that signed it.
	KeyID string
	// PredicateType and Predicate are the statement's.
	PredicateType string
	Predicate     json.RawMessage
}

// Statement is an in-toto statement about one image digest.
type Statement struct {
	// Subject is the digest the statement is about ("sha256:...").
	Subject string
	// SubjectName names it for people (a repository); it is not checked.
	SubjectName string
	// PredicateType says what the predicate is.
	PredicateType string
	// Predicate is the predicate's JSON; nil means {}.
	Predicate json.RawMessage
}

// inTotoStatement is a statement as JSON.
type inTotoStatement struct {
	Type          string          `json:"_type"`
	Subject       []inTotoSubject `json:"subject"`
	PredicateType string          `json:"predicateType"`
	Predicate     json.RawMessage `json:"predicate"`
}

type inTotoSubject struct {
	Name   string            `json:"name,omitempty"`
	Digest map[string]string `json:"digest"`
}

// bundle is the part of a sigstore bundle v0.3 this package writes and
// reads: a public key hint and one DSSE envelope.
type bundle struct {
	MediaType            string               `json:"mediaType"`
	VerificationMaterial verificationMaterial `json:"verificationMaterial"`
	DSSEEnvelope         *dsseEnvelope        `json:"dsseEnvelope"`
}

type verificationMaterial struct {
	PublicKey *struct {
		Hint string `json:"hint"`
	} `json:"publicKey,omitempty"`
}

type dsseEnvelope struct {
	Payload     []byte          `json:"payload"`
	PayloadType string          `json:"payloadType"`
	Signatures  []dsseSignature `json:"signatures"`
}

type dsseSignature struct {
	Sig   []byte `json:"sig"`
	KeyID string `json:"keyid,omitempty"`
}

// pae is DSSE's pre-authentication encoding, what a signature signs.
func pae(payloadType string, payload []byte) []byte {
	return fmt.Appendf(nil, "DSSEv1 %d %s %d %s", len(payloadType), payloadType, len(payload), payload)
}

// Sign returns the sigstore bundle (JSON) of st: its in-toto statement in
// a DSSE envelope signed with the signer's key, and the key's ID as the
// bundle's public key hint. cosign 3 and sigstore-go read it.
func (s *Signer) Sign(_ context.Context, st Statement) ([]byte, error) {
	hexDigest, ok := strings.CutPrefix(st.Subject, "sha256:")
	if !ok {
		return nil, fmt.Errorf("the subject %q is not a sha256 digest", st.Subject)
	}
	pred := st.Predicate
	if pred == nil {
		pred = json.RawMessage("{}")
	}
	payload, err := json.Marshal(inTotoStatement{
		Type:          statementType,
		Subject:       []inTotoSubject{{Name: st.SubjectName, Digest: map[string]string{"sha256": hexDigest}}},
		PredicateType: st.PredicateType,
		Predicate:     pred,
	})
	if err != nil {
		return nil, err
	}
	signed := pae(InTotoPayloadType, payload)
	if s.hash != 0 {
		h := s.hash.New()
		h.Write(signed)
		signed = h.Sum(nil)
	}
	sig, err := s.key.Sign(rand.Reader, signed, s.hash)
	if err != nil {
		return nil, fmt.Errorf("signing the statement: %w", err)
	}
	b := bundle{MediaType: BundleMediaType, DSSEEnvelope: &dsseEnvelope{Payload: payload, PayloadType: InTotoPayloadType, Signatures: []dsseSignature{{Sig: sig}}}}
	b.VerificationMaterial.PublicKey = &struct {
		Hint string `json:"hint"`
	}{s.id}
	return json.Marshal(b)
}

// KeyChecker checks bundles against trusted public keys with the
// standard library alone: the DSSE signature over the statement, its one
// subject and its predicate type. It is for showing a verdict to people
// (imagectl); hubs decide with internal/trust, through sigstore-go, and
// the tests hold both to the same answers.
type KeyChecker struct {
	keys []crypto.PublicKey
}

// NewKeyChecker trusts keys; at least one is needed.
func NewKeyChecker(keys []crypto.PublicKey) (*KeyChecker, error) {
	if len(keys) == 0 {
		return nil, errors.New("no trusted key")
	}
	for _, k := range keys {
		if _, _, err := algorithm(k); err != nil {
			return nil, err
		}
	}
	return &KeyChecker{keys: keys}, nil
}

// Verify checks that bundleJSON is signed by one of the trusted keys and
// holds an in-toto statement whose one subject is exactly subject and
// whose predicate type is predicateType.
func (c *KeyChecker) Verify(bundleJSON []byte, subject, predicateType string) (*Verified, error) {
	if limit := MaxBundleSizeOf(predicateType); int64(len(bundleJSON)) > limit {
		return nil, fmt.Errorf("%w: the bundle is %d bytes, over the limit of %d", ErrNotVerified, len(bundleJSON), limit)
	}
	var b bundle
	if err := json.Unmarshal(bundleJSON, &b); err != nil {
		return nil, fmt.Errorf("%w: reading the bundle: %v", ErrNotVerified, err)
	}
	env := b.DSSEEnvelope
	if !strings.HasPrefix(b.MediaType, "application/vnd.dev.sigstore.bundle") || env == nil || env.PayloadType != InTotoPayloadType || len(env.Signatures) != 1 {
		return nil, fmt.Errorf("%w: not a bundle of one signed in-toto statement", ErrNotVerified)
	}
	msg := pae(env.PayloadType, env.Payload)
	var keyID string
	for _, k := range c.keys {
		if checkSignature(k, msg, env.Signatures[0].Sig) {
			keyID, _ = KeyID(k)
			break
		}
	}
	if keyID == "" {
		return nil, fmt.Errorf("%w: no trusted key verifies the bundle for %s", ErrNotVerified, subject)
	}
	var st inTotoStatement
	dec := json.NewDecoder(bytes.NewReader(env.Payload))
	if err := dec.Decode(&st); err != nil {
		return nil, fmt.Errorf("%w: reading the statement: %v", ErrNotVerified, err)
	}
	want, _ := strings.CutPrefix(subject, "sha256:")
	if st.Type != statementType || len(st.Subject) != 1 || len(st.Subject[0].Digest) != 1 || st.Subject[0].Digest["sha256"] != want {
		return nil, fmt.Errorf("%w: the statement is not about %s alone", ErrNotVerified, subject)
	}
	if st.PredicateType != predicateType {
		return nil, fmt.Errorf("%w: the statement's predicate type is %q, not %q", ErrNotVerified, st.PredicateType, predicateType)
	}
	return &Verified{KeyID: keyID, PredicateType: st.PredicateType, Predicate: st.Predicate}, nil
}

// checkSignature reports whether sig is key's signature of msg.
func checkSignature(key crypto.PublicKey, msg, sig []byte) bool {
	_, hash, err := algorithm(key)
	if err != nil {
		return false
	}
	switch k := key.(type) {
	case ed25519.PublicKey:
		return ed25519.Verify(k, msg, sig)
	case *ecdsa.PublicKey:
		h := hash.New()
		h.Write(msg)
		return ecdsa.VerifyASN1(k, h.Sum(nil), sig)
	}
	return false
}

// Signer signs statements with one private key. It is safe for
// concurrent use.
type Signer struct {
	key  crypto.Signer
	hash crypto.Hash
	id   string
}

// LoadSigner reads a private key (PEM: PKCS#8, SEC 1, or a cosign
// encrypted key, which needs password; nil means none was given).
func LoadSigner(data, password []byte) (*Signer, error) {
	key, err := parsePrivateKey(data, password)
	if err != nil {
		return nil, err
	}
	return NewSigner(key)
}

// NewSigner signs with key: ECDSA P-256 or P-384, or Ed25519.
func NewSigner(key crypto.Signer) (*Signer, error) {
	_, hash, err := algorithm(key.Public())
	if err != nil {
		return nil, err
	}
	id, err := KeyID(key.Public())
	if err != nil {
		return nil, err
	}
	return &Signer{key: key, hash: hash, id: id}, nil
}

// KeyID is the identifier of the signer's public key (see KeyID).
func (s *Signer) KeyID() string { return s.id }

// Public is the signer's public key.
func (s *Signer) Public() crypto.PublicKey { return s.key.Public() }
