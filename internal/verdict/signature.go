package verdict

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/imagepipe/imagepipe/internal/attest"
	"github.com/imagepipe/imagepipe/internal/reject"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// Sign signs subject (whose manifest subjectDesc describes) as cosign 3's
// `cosign sign --key` does: an in-toto statement of predicate type
// attest.CosignSignPredicateType with an empty predicate, in a sigstore
// bundle attached as a referrer. `cosign verify --key` accepts it. It
// returns the referrer's digest.
func Sign(ctx context.Context, reg Registry, signer *attest.Signer, subject name.Digest, subjectDesc ocispec.Descriptor) (string, error) {
	a, err := PublishStatement(ctx, reg, signer, subject, subjectDesc, attest.CosignSignPredicateType, nil, "")
	return a.Digest, err
}

// ErrNotSigned is matched by FindSignature's error when no signature by a
// trusted key is attached to the subject.
var ErrNotSigned = errors.New("not signed by a trusted key")

// NotSignedError says why no signature was trusted: none attached, or
// only ones that failed a check (Refused says which and why).
type NotSignedError struct {
	Subject string
	Refused []string
}

func (e *NotSignedError) Error() string {
	if len(e.Refused) == 0 {
		return fmt.Sprintf("%s has no signature", e.Subject)
	}
	return fmt.Sprintf("%s has no signature by a trusted key: %s", e.Subject, strings.Join(e.Refused, "; "))
}

func (e *NotSignedError) Is(target error) bool { return target == ErrNotSigned }

// FindSignature returns the ID of a trusted key that signed subject (as
// Sign or `cosign sign --key` sign), or a *NotSignedError. Registry
// failures are errors. Only sigstore bundles are looked at (cosign 3's
// format), at most registry.MaxReferrers of them, and the manifest
// referrer names when it is not "" (one its pusher said it attached, which
// a referrers tag rewritten by two writers at once may have lost).
func FindSignature(ctx context.Context, reg Registry, trust Checker, subject name.Digest, referrer string) (string, error) {
	candidates, err := bundles(ctx, reg, subject, attest.CosignSignPredicateType)
	if err != nil {
		return "", err
	}
	if referrer != "" && !slices.Contains(candidates, referrer) {
		candidates = append(candidates, referrer)
	}
	ns := &NotSignedError{Subject: subject.String()}
	for _, d := range candidates {
		bundle, err := fetchArtifact(ctx, reg, subject.Context(), d, attest.BundleMediaType, attest.MaxBundleSize)
		if d == referrer && err != nil {
			continue // not a bundle: whatever it is, it is no signature
		}
		if err != nil {
			return "", err
		}
		v, err := trust.Verify(bundle, subject.DigestStr(), attest.CosignSignPredicateType)
		if err != nil {
			ns.Refused = append(ns.Refused, fmt.Sprintf("%s: %v", d, err))
			continue
		}
		return v.KeyID, nil
	}
	return "", ns
}

// AwaitsSignature reports whether v refused its subject only for want of
// the tenant's signature (reject.Unsigned, reject.UntrustedSignature): a
// signature pushed since may lift it, so the gate and the hubs look again.
func AwaitsSignature(v *api.Verdict) bool {
	if v.Verdict != api.VerdictRejected || len(v.Reasons) == 0 {
		return false
	}
	for _, r := range v.Reasons {
		if !reject.Reason(r.Code).IsSignature() {
			return false
		}
	}
	return true
}
