// Package verdict publishes the gate's signed verdicts on pushed images and
// finds them again, for the gate (work already done) and for each hub's
// syncer (the only ground on which it imports anything).
//
// A verdict (api.Verdict) is signed by internal/attest as an in-toto
// statement about the pushed digest and attached to that digest as an OCI
// 1.1 referrer with oras-go (on registries without the referrers API,
// through the referrers tag, which oras-go extends). Find trusts a verdict
// only when a trusted key signed it, its statement's subject is the digest
// asked about, and it names the repository it is found in: a verdict
// copied into another repository admits nothing there. Anyone with push
// access can add referrers; at most registry.MaxReferrers are looked at,
// each bundle at most attest.MaxBundleSizeOf its predicate type.
//
// PublishStatement is the one way anything is signed and attached: the
// verdict, a tenant's signature (Sign) and the gate's SBOM of a guest (a
// CycloneDX statement, which FindStatement finds for imagectl).
package verdict

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/registry/remote"

	"github.com/imagepipe/imagepipe/internal/attest"
	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// PredicateTypeAnnotation is the referrer manifest annotation naming the
// bundle's predicate type, as cosign writes it; it lets a reader skip
// bundles of other kinds without fetching them.
const PredicateTypeAnnotation = "dev.sigstore.bundle.predicateType"

// Checker checks a bundle: signed by a trusted key, about exactly
// subject, of predicateType. *trust.Verifier (sigstore-go, what hubs and
// the gate use) and *attest.KeyChecker implement it.
type Checker interface {
	Verify(bundle []byte, subject, predicateType string) (*attest.Verified, error)
}

// Registry is what publishing and finding verdicts needs of a registry;
// *registry.Client implements it.
type Registry interface {
	Referrers(ctx context.Context, subject name.Digest, artifactType string) (refs []v1.Descriptor, tag string, err error)
	FetchManifest(ctx context.Context, ref name.Reference) (*registry.RawManifest, error)
	OpenBlob(ctx context.Context, repo name.Repository, digest string) (io.ReadCloser, error)
	// ORASRepository opens repo for Attach's pushes.
	ORASRepository(ctx context.Context, repo name.Repository) (*remote.Repository, error)
}

var _ Registry = (*registry.Client)(nil)

// Publish signs v with signer and attaches it to subject, whose manifest
// subjectDesc describes. It returns what was attached.
func Publish(ctx context.Context, reg Registry, signer *attest.Signer, subject name.Digest, subjectDesc ocispec.Descriptor, v *api.Verdict) (Attached, error) {
	pred, err := json.Marshal(v)
	if err != nil {
		return Attached{}, err
	}
	return PublishStatement(ctx, reg, signer, subject, subjectDesc, api.VerdictPredicateType, pred, v.VerifiedAt)
}

// PublishStatement signs predicate, of predicateType, as an in-toto
// statement about subject with signer, and attaches the bundle to
// subject (whose manifest subjectDesc describes) as cosign 3's `cosign
// attest` does: a referrer of artifact type and layer media type
// attest.BundleMediaType, annotated with its predicate type and, when
// created is set, its creation time. `cosign verify-attestation --type
// predicateType` finds it. The verdict, a tenant's signature and the
// guest's SBOM are all attached here.
func PublishStatement(ctx context.Context, reg Registry, signer *attest.Signer, subject name.Digest, subjectDesc ocispec.Descriptor, predicateType string, predicate []byte, created string) (Attached, error) {
	bundle, err := signer.Sign(ctx, attest.Statement{
		Subject: subject.DigestStr(), SubjectName: subject.Context().Name(),
		PredicateType: predicateType, Predicate: predicate,
	})
	if err != nil {
		return Attached{}, err
	}
	annotations := map[string]string{
		PredicateTypeAnnotation:       predicateType,
		"dev.sigstore.bundle.content": "dsse-envelope",
	}
	if created != "" {
		annotations["org.opencontainers.image.created"] = created
	}
	return Attach(ctx, reg, subject, subjectDesc, Artifact{
		ArtifactType: api.VerdictArtifactType, MediaType: attest.BundleMediaType, Content: bundle, Annotations: annotations,
	})
}

// ErrNoStatement is matched by FindStatement's error when subject has no
// statement of the type asked for that a trusted key signed.
var ErrNoStatement = errors.New("no trusted statement")

// FindStatement returns the predicate of a statement of predicateType
// about subject that trust verifies, among subject's referrers (the
// newest by the registry's listing order is not assumed: the first that
// verifies is taken, so statements of one type must say the same, as
// the gate's SBOMs of one digest do). Each bundle is read up to
// attest.MaxBundleSizeOf(predicateType). Without one, the error matches
// ErrNoStatement and says why each found was refused.
func FindStatement(ctx context.Context, reg Registry, trust Checker, subject name.Digest, predicateType string) (json.RawMessage, error) {
	listed, err := bundles(ctx, reg, subject, predicateType)
	if err != nil {
		return nil, err
	}
	var refused []string
	for _, d := range listed {
		bundle, err := fetchBundle(ctx, reg, subject.Context(), Referrer{Digest: d}, predicateType)
		if err != nil {
			refused = append(refused, fmt.Sprintf("%s: %v", d, err))
			continue
		}
		st, err := trust.Verify(bundle, subject.DigestStr(), predicateType)
		if err != nil {
			refused = append(refused, fmt.Sprintf("%s: %v", d, err))
			continue
		}
		return st.Predicate, nil
	}
	if len(refused) == 0 {
		return nil, fmt.Errorf("%s has no %s statement: %w", subject, predicateType, ErrNoStatement)
	}
	return nil, fmt.Errorf("%s has no trusted %s statement (%s): %w", subject, predicateType, strings.Join(refused, "; "), ErrNoStatement)
}

// ErrNoVerdict is matched by Find's error when subject has no verdict a
// trusted key signed for it in its repository.
var ErrNoVerdict = errors.New("no trusted verdict")

// NoVerdictError says why no verdict was trusted: none attached, or only
// ones that failed a check (Refused says which and why).
type NoVerdictError struct {
	Subject string
	// Refused are the verdicts found but not trusted, each with why.
	Refused []string
}

func (e *NoVerdictError) Error() string {
	if len(e.Refused) == 0 {
		return fmt.Sprintf("%s has no verdict from the gate yet", e.Subject)
	}
	return fmt.Sprintf("%s has no trusted verdict: %s", e.Subject, strings.Join(e.Refused, "; "))
}

func (e *NoVerdictError) Is(target error) bool { return target == ErrNoVerdict }

// Forged reports whether a verdict was found and refused, as opposed to
// none found at all.
func (e *NoVerdictError) Forged() bool { return len(e.Refused) > 0 }

// Referrer is a manifest attached to a subject that something other
// than the registry's listing told of (a registry event announcing a
// verdict's push), which the listing may not show yet.
type Referrer struct {
	Digest string
	// Manifest, when set, is the referrer's manifest as fetched by Digest
	// (registry.Client.FetchManifest): its bytes are read, once their
	// digest is checked, rather than fetched again.
	Manifest *registry.RawManifest
}

// Find returns the newest verdict on subject that trust verifies and that
// was given in subject's repository. Registry failures are errors; a
// subject without such a verdict is a *NoVerdictError.
//
// also are referrers of subject learnt elsewhere, oldest first: they are
// candidates too, and pass the same checks (the last MaxAlso are read).
func Find(ctx context.Context, reg Registry, trust Checker, subject name.Digest, also ...Referrer) (*api.Verdict, error) {
	v, _, err := FindSigned(ctx, reg, trust, subject, also...)
	return v, err
}

// FindSigned is Find, and also says which trusted key signed the verdict
// it returns (attest.KeyID), so that the gate can sign again with its
// current key a verdict an older key signed.
func FindSigned(ctx context.Context, reg Registry, trust Checker, subject name.Digest, also ...Referrer) (*api.Verdict, string, error) {
	listed, err := bundles(ctx, reg, subject, api.VerdictPredicateType)
	if err != nil {
		return nil, "", err
	}
	candidates := make([]Referrer, 0, len(listed)+MaxAlso)
	for _, d := range listed {
		candidates = append(candidates, Referrer{Digest: d})
	}
	for _, r := range also[max(0, len(also)-MaxAlso):] { // the newest, if more came
		i := slices.IndexFunc(candidates, func(c Referrer) bool { return c.Digest == r.Digest })
		switch {
		case i < 0:
			candidates = append(candidates, r)
		case candidates[i].Manifest == nil:
			candidates[i].Manifest = r.Manifest
		}
	}
	var best *api.Verdict
	var bestKey string
	nv := &NoVerdictError{Subject: subject.String()}
	for _, c := range candidates {
		bundle, err := fetchBundle(ctx, reg, subject.Context(), c, api.VerdictPredicateType)
		if err != nil {
			return nil, "", err
		}
		v, key, err := check(bundle, trust, subject)
		if err != nil {
			nv.Refused = append(nv.Refused, fmt.Sprintf("%s: %v", c.Digest, err))
			continue
		}
		if best == nil || newer(v, best) {
			best, bestKey = v, key
		}
	}
	if best == nil {
		return nil, "", nv
	}
	return best, bestKey, nil
}

// fetchBundle reads the sigstore bundle r holds, a statement of
// predicateType, within its bound: from the manifest given when its bytes
// are r's, else from the manifest fetched by r's digest.
func fetchBundle(ctx context.Context, reg Registry, repo name.Repository, r Referrer, predicateType string) ([]byte, error) {
	limit := attest.MaxBundleSizeOf(predicateType)
	if m := r.Manifest; m != nil && len(m.Bytes) <= registry.MaxIndexSize && digest.FromBytes(m.Bytes).String() == r.Digest {
		return artifactLayer(ctx, reg, repo, &registry.RawManifest{Digest: r.Digest, MediaType: m.MediaType, Bytes: m.Bytes}, attest.BundleMediaType, limit)
	}
	return fetchArtifact(ctx, reg, repo, r.Digest, attest.BundleMediaType, limit)
}

// bundles lists the referrers of subject that may be sigstore bundles of
// predicateType: those whose predicate annotation names it, and those
// without one whose artifact type is a bundle's. All referrers are asked
// for, not those of the bundle's artifact type: some registries (zot 1.4)
// report the config's media type as a referrer's artifact type. What is
// not such a bundle fails the checks that follow.
func bundles(ctx context.Context, reg Registry, subject name.Digest, predicateType string) ([]string, error) {
	refs, _, err := reg.Referrers(ctx, subject, "")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, r := range refs {
		p, annotated := r.Annotations[PredicateTypeAnnotation]
		if annotated && p != predicateType || !annotated && r.ArtifactType != api.VerdictArtifactType {
			continue
		}
		out = append(out, r.Digest.String())
	}
	return out, nil
}

// MaxAlso bounds the referrers Find reads beyond the registry's listing.
const MaxAlso = 4

// newer reports whether a was given after b. A time that does not parse
// is older than any that does.
func newer(a, b *api.Verdict) bool {
	ta, errA := time.Parse(time.RFC3339Nano, a.VerifiedAt)
	tb, errB := time.Parse(time.RFC3339Nano, b.VerifiedAt)
	switch {
	case errA != nil:
		return false
	case errB != nil:
		return true
	}
	return ta.After(tb)
}

// check verifies one bundle as a verdict on subject.
func check(bundle []byte, trust Checker, subject name.Digest) (*api.Verdict, string, error) {
	st, err := trust.Verify(bundle, subject.DigestStr(), api.VerdictPredicateType)
	if err != nil {
		return nil, "", err
	}
	var v api.Verdict
	if err := json.Unmarshal(st.Predicate, &v); err != nil {
		return nil, "", fmt.Errorf("reading the verdict: %w", err)
	}
	switch {
	case v.Subject != subject.DigestStr():
		return nil, "", fmt.Errorf("the verdict is about %s", v.Subject)
	case v.Repository != subject.RepositoryStr():
		return nil, "", fmt.Errorf("the verdict was given in repository %s, not %s", v.Repository, subject.RepositoryStr())
	case v.Verdict != api.VerdictAccepted && v.Verdict != api.VerdictRejected:
		return nil, "", fmt.Errorf("the verdict says %q", v.Verdict)
	case v.Verdict == api.VerdictAccepted && len(v.Images) == 0:
		return nil, "", errors.New("the verdict accepts no image")
	}
	return &v, st.KeyID, nil
}
