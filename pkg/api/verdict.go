package api

// The gate's verdict on a pushed image, as it is signed and stored in the
// registry: the predicate of an in-toto statement whose subject is the
// image (or index) the tenant pushed, in a DSSE envelope inside a sigstore
// bundle (v0.3), attached to that digest as an OCI 1.1 referrer.
const (
	// VerdictPredicateType is the in-toto predicate type of a Verdict.
	VerdictPredicateType = "https://imagepipe.io/verdict/v1"
	// VerdictArtifactType is the artifact type of the referrer manifest
	// holding a verdict: a sigstore bundle, as cosign writes one.
	VerdictArtifactType = "application/vnd.dev.sigstore.bundle.v0.3+json"
)

// Verdict is the gate's signed answer for one pushed digest.
type Verdict struct {
	// Repository is the repository the verdict was given in, without the
	// registry ("acme/rhel"). A verdict copied into another repository
	// does not admit the image there.
	Repository string `json:"repository"`
	// Subject is the digest that was pushed: an image manifest or an
	// index ("sha256:...").
	Subject string `json:"subject"`
	// Verdict is VerdictAccepted or VerdictRejected.
	Verdict string `json:"verdict"`
	// Reasons explain a rejection, with the codes of docs/security.md.
	Reasons []Rejection `json:"reasons,omitempty"`
	// Images are the verified images: one for an image manifest, one per
	// platform for an index. Empty when the subject was rejected.
	Images []VerifiedImage `json:"images,omitempty"`
	// Engine names the verifier that gave the verdict ("imagepipe-gate").
	Engine string `json:"engine"`
	// EngineVersion is its version.
	EngineVersion string `json:"engineVersion"`
	// VerifiedAt is when the verdict was given, in VerdictTimeFormat
	// (RFC 3339, UTC, nanoseconds). Of several verdicts on one subject the
	// newest counts.
	VerifiedAt string `json:"verifiedAt"`
	// SignedBy is the ID of the tenant's key (as KeyID in SignResult)
	// whose signature on Subject the gate found, when the tenant's policy
	// requires one.
	SignedBy string `json:"signedBy,omitempty"`
}

// VerdictTimeFormat is the layout of Verdict.VerifiedAt: RFC 3339 with
// all nine fractional digits, so that verdicts given within one second
// still order, as times and as strings.
const VerdictTimeFormat = "2006-01-02T15:04:05.000000000Z07:00"

// VerifiedImage is one image the gate read in full and the canonical
// containerDisk it published for it: the image hubs import.
type VerifiedImage struct {
	// Platform is the image's platform ("linux/amd64").
	Platform string `json:"platform"`
	// Source is the manifest digest of the image as pushed.
	Source string `json:"source"`
	// Canonical is the manifest digest of the canonical containerDisk, in
	// the same repository, written by imagepipe. It equals Source when the
	// pushed image already was canonical (an `imagectl import`).
	Canonical string `json:"canonical"`
	// Format is the disk format of disk/disk.img (qcow2 or raw).
	Format string `json:"format"`
	// VirtualSize is the guest disk size in bytes.
	VirtualSize int64 `json:"virtualSize"`
	// DiskSize is the size of the canonical disk/disk.img in bytes.
	DiskSize int64 `json:"diskSize"`
	// Instancetype and Preference are the KubeVirt defaults the image
	// names, if any.
	Instancetype string `json:"instancetype,omitempty"`
	Preference   string `json:"preference,omitempty"`
	// Checks lists what was verified (ChecksPassed).
	Checks []string `json:"checks"`
	// Guest is what the disk holds, as the gate read it; nil when it was
	// not read (a disk verified as it streamed).
	Guest *GuestReport `json:"guest,omitempty"`
}

// ChecksPassed are the checks every accepted image passed, in the order
// the gate runs them.
var ChecksPassed = []string{
	"manifest-digest", "manifest-shape", "config-shape", "blob-digest",
	"layer-framing", "tar-shape", "disk-header", "disk-tables", "disk-data", "canonical-form",
}

// SignResult is what `imagectl sign -o json` prints.
type SignResult struct {
	// Reference is the image signed, pinned by digest.
	Reference string `json:"reference"`
	// Digest is its digest.
	Digest string `json:"digest"`
	// Signature is the digest of the referrer holding the signature.
	Signature string `json:"signature"`
	// KeyID identifies the signing key (base64 of the sha256 of its public
	// key), as sigstore bundles name it.
	KeyID string `json:"keyID"`
}
