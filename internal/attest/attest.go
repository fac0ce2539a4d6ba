package attest

import (
	"context"
	"crypto"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	protobundle "github.com/sigstore/protobuf-specs/gen/pb-go/bundle/v1"
	protocommon "github.com/sigstore/protobuf-specs/gen/pb-go/common/v1"
	sgbundle "github.com/sigstore/sigstore-go/pkg/bundle"
	"github.com/sigstore/sigstore-go/pkg/root"
	"github.com/sigstore/sigstore-go/pkg/sign"
	"github.com/sigstore/sigstore-go/pkg/verify"
	"github.com/sigstore/sigstore/pkg/signature"
	"google.golang.org/protobuf/encoding/protojson"
)

// Media and payload types of what this package writes.
const (
	// BundleMediaType is a sigstore bundle v0.3 as JSON: the media type of
	// the referrer's blob and its artifact type.
	BundleMediaType = "application/vnd.dev.sigstore.bundle.v0.3+json"
	// inTotoPayloadType is the DSSE payload type of an in-toto statement.
	inTotoPayloadType = "application/vnd.in-toto+json"
	// statementType is the in-toto statement version written.
	statementType = "https://in-toto.io/Statement/v1"
	// CosignSignPredicateType is the predicate type of a cosign 3 image
	// signature (`cosign sign --key`): an empty predicate.
	CosignSignPredicateType = "https://sigstore.dev/cosign/sign/v1"
)

// MaxBundleSize bounds a bundle this package reads: a key-signed bundle
// is a few KiB.
const MaxBundleSize = 256 << 10

// Signer signs statements with one private key. It is safe for
// concurrent use.
type Signer struct {
	key  crypto.Signer
	alg  protocommon.PublicKeyDetails
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
	alg, hash, err := algorithm(key.Public())
	if err != nil {
		return nil, err
	}
	id, err := KeyID(key.Public())
	if err != nil {
		return nil, err
	}
	return &Signer{key: key, alg: alg, hash: hash, id: id}, nil
}

// KeyID is the identifier of the signer's public key (see KeyID).
func (s *Signer) KeyID() string { return s.id }

// Public is the signer's public key.
func (s *Signer) Public() crypto.PublicKey { return s.key.Public() }

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

// Sign returns the sigstore bundle (JSON) of st, signed.
func (s *Signer) Sign(ctx context.Context, st Statement) ([]byte, error) {
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
	b, err := sign.Bundle(&sign.DSSEData{Data: payload, PayloadType: inTotoPayloadType}, keypair{s}, sign.BundleOptions{Context: ctx})
	if err != nil {
		return nil, fmt.Errorf("signing the statement: %w", err)
	}
	return protojson.Marshal(b)
}

// keypair adapts a Signer to sigstore-go's sign.Keypair.
type keypair struct{ s *Signer }

var _ sign.Keypair = keypair{}

func (k keypair) GetHashAlgorithm() protocommon.HashAlgorithm {
	if k.s.hash == crypto.SHA384 {
		return protocommon.HashAlgorithm_SHA2_384
	}
	return protocommon.HashAlgorithm_SHA2_256
}
func (k keypair) GetSigningAlgorithm() protocommon.PublicKeyDetails { return k.s.alg }
func (k keypair) GetHint() []byte                                   { return []byte(k.s.id) }
func (k keypair) GetKeyAlgorithm() string {
	if k.s.alg == protocommon.PublicKeyDetails_PKIX_ED25519 {
		return "ED25519"
	}
	return "ECDSA"
}
func (k keypair) GetPublicKey() crypto.PublicKey { return k.s.key.Public() }
func (k keypair) GetPublicKeyPem() (string, error) {
	b, err := MarshalPublicKey(k.s.key.Public())
	return string(b), err
}

// SignData signs data's digest (ECDSA) or data itself (Ed25519) and
// returns the signature and what was signed.
func (k keypair) SignData(_ context.Context, data []byte) ([]byte, []byte, error) {
	signed := data
	if k.s.hash != 0 {
		h := k.s.hash.New()
		h.Write(data)
		signed = h.Sum(nil)
	}
	sig, err := k.s.key.Sign(rand.Reader, signed, k.s.hash)
	return sig, signed, err
}

// Verifier checks bundles against a set of trusted public keys.
type Verifier struct {
	keys []trustedKey
}

type trustedKey struct {
	id       string
	verifier signature.Verifier
}

// NewVerifier trusts keys; at least one is needed.
func NewVerifier(keys []crypto.PublicKey) (*Verifier, error) {
	if len(keys) == 0 {
		return nil, errors.New("no trusted key")
	}
	v := &Verifier{}
	for _, pub := range keys {
		_, hash, err := algorithm(pub)
		if err != nil {
			return nil, err
		}
		if hash == 0 {
			hash = crypto.SHA512 // ignored by Ed25519; LoadVerifier wants one
		}
		sv, err := signature.LoadVerifier(pub, hash)
		if err != nil {
			return nil, err
		}
		id, err := KeyID(pub)
		if err != nil {
			return nil, err
		}
		v.keys = append(v.keys, trustedKey{id: id, verifier: sv})
	}
	return v, nil
}

// ErrNotVerified is matched by every error of Verify that says the bundle
// does not prove what was asked (as opposed to one that is unreadable).
var ErrNotVerified = errors.New("not verified")

// Verified is a statement whose signature checked out.
type Verified struct {
	// KeyID identifies the trusted key that signed it.
	KeyID string
	// PredicateType and Predicate are the statement's.
	PredicateType string
	Predicate     json.RawMessage
}

// Verify checks that bundleJSON is signed by one of the trusted keys and
// holds an in-toto statement whose subject is exactly subject (a sha256
// digest) and whose predicate type is predicateType.
func (v *Verifier) Verify(bundleJSON []byte, subject, predicateType string) (*Verified, error) {
	if len(bundleJSON) > MaxBundleSize {
		return nil, fmt.Errorf("%w: the bundle is %d bytes, over the limit of %d", ErrNotVerified, len(bundleJSON), MaxBundleSize)
	}
	want, err := hex.DecodeString(strings.TrimPrefix(subject, "sha256:"))
	if err != nil || !strings.HasPrefix(subject, "sha256:") || len(want) != 32 {
		return nil, fmt.Errorf("the subject %q is not a sha256 digest", subject)
	}
	var pb protobundle.Bundle
	if err := protojson.Unmarshal(bundleJSON, &pb); err != nil {
		return nil, fmt.Errorf("%w: reading the bundle: %v", ErrNotVerified, err)
	}
	b, err := sgbundle.NewBundle(&pb)
	if err != nil {
		return nil, fmt.Errorf("%w: reading the bundle: %v", ErrNotVerified, err)
	}
	if b.GetDsseEnvelope() == nil {
		return nil, fmt.Errorf("%w: the bundle holds no DSSE envelope", ErrNotVerified)
	}
	var lastErr error
	for _, k := range v.ordered(b) {
		res, err := verifyWith(k, b, want)
		if err != nil {
			lastErr = err
			continue
		}
		st := res.Statement
		if st == nil || st.PredicateType != predicateType {
			got := ""
			if st != nil {
				got = st.PredicateType
			}
			return nil, fmt.Errorf("%w: the statement's predicate type is %q, not %q", ErrNotVerified, got, predicateType)
		}
		if len(st.Subject) != 1 {
			return nil, fmt.Errorf("%w: the statement names %d subjects; one is expected", ErrNotVerified, len(st.Subject))
		}
		pred, err := protojson.Marshal(st.Predicate)
		if err != nil {
			return nil, err
		}
		return &Verified{KeyID: k.id, PredicateType: st.PredicateType, Predicate: pred}, nil
	}
	return nil, fmt.Errorf("%w: no trusted key verifies the bundle for %s: %v", ErrNotVerified, subject, lastErr)
}

// ordered puts the key the bundle's hint names first.
func (v *Verifier) ordered(b *sgbundle.Bundle) []trustedKey {
	hint := ""
	if pk := b.GetVerificationMaterial().GetPublicKey(); pk != nil {
		hint = pk.GetHint()
	}
	out := make([]trustedKey, 0, len(v.keys))
	for _, k := range v.keys {
		if k.id == hint {
			out = append([]trustedKey{k}, out...)
		} else {
			out = append(out, k)
		}
	}
	return out
}

// verifyWith checks b's signature with k alone, and that its statement's
// subject digest is want.
func verifyWith(k trustedKey, b *sgbundle.Bundle, want []byte) (*verify.VerificationResult, error) {
	material := root.NewTrustedPublicKeyMaterial(func(string) (root.TimeConstrainedVerifier, error) {
		return alwaysValid{k.verifier}, nil
	})
	sv, err := verify.NewVerifier(material, verify.WithNoObserverTimestamps())
	if err != nil {
		return nil, err
	}
	return sv.Verify(b, verify.NewPolicy(verify.WithArtifactDigest("sha256", want), verify.WithKey()))
}

// alwaysValid is a trusted key without a validity period: the provider
// removes a key from its key ring to stop trusting it.
type alwaysValid struct{ signature.Verifier }

func (alwaysValid) ValidAtTime(time.Time) bool { return true }
