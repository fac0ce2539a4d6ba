// Package trust checks sigstore bundles against trusted public keys with
// sigstore-go, the verification library the cosign maintainers
// recommend: the hubs' (image-syncer's) and the gate's ground for trusting
// a verdict or a signature. A bundle is trusted when one of the keys
// signed its DSSE envelope, its in-toto statement's subject is exactly
// the digest asked about, and its predicate type is the one asked for.
// Several keys may be trusted at once, for rotation. Bundles are read
// only up to attest.MaxBundleSizeOf its predicate type.
package trust

import (
	"crypto"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	protobundle "github.com/sigstore/protobuf-specs/gen/pb-go/bundle/v1"
	sgbundle "github.com/sigstore/sigstore-go/pkg/bundle"
	"github.com/sigstore/sigstore-go/pkg/root"
	"github.com/sigstore/sigstore-go/pkg/verify"
	"github.com/sigstore/sigstore/pkg/signature"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/imagepipe/imagepipe/internal/attest"
)

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
		hash, err := attest.HashOf(pub)
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
		id, err := attest.KeyID(pub)
		if err != nil {
			return nil, err
		}
		v.keys = append(v.keys, trustedKey{id: id, verifier: sv})
	}
	return v, nil
}

// Verify checks that bundleJSON is signed by one of the trusted keys and
// holds an in-toto statement whose subject is exactly subject (a sha256
// digest) and whose predicate type is predicateType. Every error saying
// the bundle proves nothing matches attest.ErrNotVerified.
func (v *Verifier) Verify(bundleJSON []byte, subject, predicateType string) (*attest.Verified, error) {
	if limit := attest.MaxBundleSizeOf(predicateType); int64(len(bundleJSON)) > limit {
		return nil, fmt.Errorf("%w: the bundle is %d bytes, over the limit of %d", attest.ErrNotVerified, len(bundleJSON), limit)
	}
	want, err := hex.DecodeString(strings.TrimPrefix(subject, "sha256:"))
	if err != nil || !strings.HasPrefix(subject, "sha256:") || len(want) != 32 {
		return nil, fmt.Errorf("the subject %q is not a sha256 digest", subject)
	}
	var pb protobundle.Bundle
	if err := protojson.Unmarshal(bundleJSON, &pb); err != nil {
		return nil, fmt.Errorf("%w: reading the bundle: %v", attest.ErrNotVerified, err)
	}
	b, err := sgbundle.NewBundle(&pb)
	if err != nil {
		return nil, fmt.Errorf("%w: reading the bundle: %v", attest.ErrNotVerified, err)
	}
	if b.GetDsseEnvelope() == nil {
		return nil, fmt.Errorf("%w: the bundle holds no DSSE envelope", attest.ErrNotVerified)
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
			return nil, fmt.Errorf("%w: the statement's predicate type is %q, not %q", attest.ErrNotVerified, got, predicateType)
		}
		if len(st.Subject) != 1 {
			return nil, fmt.Errorf("%w: the statement names %d subjects; one is expected", attest.ErrNotVerified, len(st.Subject))
		}
		pred, err := protojson.Marshal(st.Predicate)
		if err != nil {
			return nil, err
		}
		return &attest.Verified{KeyID: k.id, PredicateType: st.PredicateType, Predicate: pred}, nil
	}
	return nil, fmt.Errorf("%w: no trusted key verifies the bundle for %s: %v", attest.ErrNotVerified, subject, lastErr)
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
