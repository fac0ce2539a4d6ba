package api

// ImageListing is one tag of `imagectl list -o json|yaml`. Images that
// imagepipe did not build are listed too, with the fields that come from
// its annotations left empty.
type ImageListing struct {
	// Repository is the full repository name, e.g. "registry/acme/rhel".
	Repository string `json:"repository"`
	// Tag is the tag; attachment tags (IsAttachmentTag) are never listed.
	Tag string `json:"tag"`
	// Digest is the manifest digest ("sha256:...").
	Digest string `json:"digest"`
	// VirtualSize is the guest disk size in bytes (AnnotationVirtualSize).
	VirtualSize int64 `json:"virtualSize,omitempty"`
	// DiskFormat is the format of disk/disk.img (AnnotationDiskFormat).
	DiskFormat string `json:"diskFormat,omitempty"`
	// Created is AnnotationCreated, or the image config's creation time.
	Created string `json:"created,omitempty"`
	// SourceDigest is the sha256 of the original upload (AnnotationSourceDigest).
	SourceDigest string `json:"sourceDigest,omitempty"`
}

// ContainerDiskReport is what `imagectl inspect docker://REF -o json` prints:
// an image in a registry, and whether it has the shape of a containerDisk
// imagepipe accepts. Only the layer's tar headers and the first cluster of
// disk/disk.img are read, so the verdict covers the image's layout and the
// disk's header, not its tables or data.
type ContainerDiskReport struct {
	// Reference is the image as the user named it.
	Reference string `json:"reference"`
	// Digest is the manifest digest ("sha256:...").
	Digest string `json:"digest"`
	// MediaType is the manifest media type.
	MediaType string `json:"mediaType"`
	// Platform is the config's OS and architecture (and variant), e.g.
	// "linux/amd64": the platform of the image the report describes.
	Platform string `json:"platform"`
	// Index is true when the reference names an image index (a
	// multi-platform image); the report describes the index's image for
	// the platform asked for (imagectl's --platform, image-syncer's hub
	// architecture), else for linux/amd64. Digest, MediaType and the rest
	// are then that image's.
	Index bool `json:"index,omitempty"`
	// IndexDigest is the digest of the index the reference names, when
	// Index.
	IndexDigest string `json:"indexDigest,omitempty"`
	// Platforms are the platforms the index holds, in its order, e.g.
	// ["linux/amd64", "linux/arm64"]; "unknown" for an entry without one
	// (an attestation or another artifact).
	Platforms []string `json:"platforms,omitempty"`
	// LayerMediaType, LayerSize and LayerDigest describe the first layer.
	LayerMediaType string `json:"layerMediaType,omitempty"`
	LayerSize      int64  `json:"layerSize,omitempty"`
	LayerDigest    string `json:"layerDigest,omitempty"`
	// Annotations are the manifest's annotations.
	Annotations map[string]string `json:"annotations,omitempty"`
	// Env is the image config's environment (EnvDefaultInstancetype, ...).
	Env []string `json:"env,omitempty"`
	// DiskFormat is the format detected from disk/disk.img's content.
	DiskFormat string `json:"diskFormat,omitempty"`
	// DiskSize is the size in bytes of disk/disk.img, from its tar header.
	DiskSize int64 `json:"diskSize,omitempty"`
	// VirtualSize is the guest disk size the disk's header declares.
	VirtualSize int64 `json:"virtualSize,omitempty"`
	// Checked says how far the disk was validated: CheckedHeader when its
	// header and every check that fits in the bytes read passed.
	Checked string `json:"checked,omitempty"`
	// Verdict is VerdictAccepted or VerdictRejected.
	Verdict string `json:"verdict"`
	// Reasons explain a rejection.
	Reasons []Rejection `json:"reasons,omitempty"`
	// Gate is the gate's verdict on the digest the reference names, as
	// hubs see it; nil when no provider key was given to check it.
	Gate *GateReport `json:"gate,omitempty"`
}

// GateReport is what `imagectl inspect docker://…` found of the gate's
// signed verdicts on an image.
type GateReport struct {
	// Subject is the digest the verdicts are about: the one the reference
	// names (an index's, for an index).
	Subject string `json:"subject"`
	// Verdict is the newest verdict a trusted key signed, nil when none.
	Verdict *Verdict `json:"verdict,omitempty"`
	// Refused are verdicts found but not trusted, each with why.
	Refused []string `json:"refused,omitempty"`
}

// CheckedHeader is ContainerDiskReport.Checked when the disk's header was
// validated; its L1/L2 tables and data, further into the layer, were not.
const CheckedHeader = "header"

// ImageOnHub is one hub's copy of a synced image, a row of `imagectl
// status -o json`.
type ImageOnHub struct {
	// Hub is the kubeconfig context that names the hub.
	Hub       string `json:"hub"`
	Namespace string `json:"namespace"`
	// Image is TENANT/IMAGE:TAG.
	Image string `json:"image"`
	// Phase is the BaseImage's phase (Pending, Importing, Ready, Failed,
	// Rejected, Deleted); NotSynced when the hub has no BaseImage for the
	// image, Unreachable when the hub could not be asked.
	Phase string `json:"phase"`
	// Digest is the digest the hub serves, else the one it works on.
	Digest string `json:"digest,omitempty"`
	// Since is when the phase began (RFC 3339), when the hub says.
	Since string `json:"since,omitempty"`
	// Reason is the reason code when the image is not Ready (a rejection's
	// reason, such as SharedCluster), and Message what it says.
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}
