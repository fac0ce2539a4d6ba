package api

import "strings"

// Annotation keys imagepipe writes on every containerDisk manifest, and
// copies into the image config's labels so that tools showing only labels
// (skopeo inspect, CDI) see them too. The image-syncer reads them back.
const (
	// AnnotationSourceDigest is the sha256 of the original bytes the
	// tenant uploaded ("sha256:<hex>"), before unwrapping or conversion.
	AnnotationSourceDigest = "io.imagepipe.source.digest"
	// AnnotationSourceFormat is the detected format of the upload (qcow2, raw).
	AnnotationSourceFormat = "io.imagepipe.source.format"
	// AnnotationDiskFormat is the format of disk/disk.img (qcow2 or raw).
	AnnotationDiskFormat = "io.imagepipe.disk.format"
	// AnnotationVirtualSize is the guest disk size in bytes, in decimal.
	AnnotationVirtualSize = "io.imagepipe.disk.virtual-size"
	// AnnotationAllocatedSize is the guest bytes backed by data, in decimal:
	// for a qcow2 disk its non-zero clusters (a figure of the content only),
	// for a raw disk the source's allocated bytes.
	AnnotationAllocatedSize = "io.imagepipe.disk.allocated-size"
	// AnnotationCreator names the tool and version that built the image.
	AnnotationCreator = "io.imagepipe.creator"
	// AnnotationOSName is the optional operating system name (e.g. "fedora-41").
	AnnotationOSName = "io.imagepipe.os.name"
	// AnnotationBuildKey identifies the source digest and build options;
	// equal keys mean an identical image, which makes re-imports instant.
	AnnotationBuildKey = "io.imagepipe.build-key"
	// AnnotationCreated is the OCI creation time, written only on request.
	AnnotationCreated = "org.opencontainers.image.created"
)

// Environment variables in the image config that CDI turns into labels on
// the imported volume, from which KubeVirt infers a VM's instancetype and
// preference.
const (
	EnvDefaultInstancetype = "INSTANCETYPE_KUBEVIRT_IO_DEFAULT_INSTANCETYPE"
	EnvDefaultPreference   = "INSTANCETYPE_KUBEVIRT_IO_DEFAULT_PREFERENCE"
)

// ContainerDisk layout: one layer holding DiskDir and DiskPath, owned by
// the qemu user KubeVirt runs as.
const (
	DiskDir  = "disk/"
	DiskPath = "disk/disk.img"
	DiskUID  = 107
	DiskGID  = 107
)

// ImportResult is what `imagectl import -o json` prints.
type ImportResult struct {
	// Reference is the tag that was written, e.g. "registry/acme/rhel:10".
	Reference string `json:"reference"`
	// Digest is the digest of what the tag now holds ("sha256:..."): the
	// image's manifest, or with --append the index's.
	Digest string `json:"digest"`
	// Pinned is Reference's repository with @Digest, for digest-pinned use.
	Pinned string `json:"pinned"`
	// Reused is true when an identical image already existed and was only
	// tagged (with --append: only added to the index).
	Reused bool `json:"reused"`
	// Platform is the platform the image was built for, e.g. "linux/arm64".
	Platform string `json:"platform,omitempty"`
	// ImageDigest is, with --append, the manifest digest of the image
	// added to the index (Digest is the index's).
	ImageDigest string `json:"imageDigest,omitempty"`
	// Platforms are, with --append, the platforms the index at the tag
	// now holds, in its order.
	Platforms []string `json:"platforms,omitempty"`
	// ReplacedIndex, without --append, lists the platforms of the image
	// index the tag held before the import replaced it with one image.
	ReplacedIndex []string `json:"replacedIndex,omitempty"`
	// LayerSize is the compressed layer size in bytes.
	LayerSize int64 `json:"layerSize"`
	// UploadedBytes is how many layer bytes were sent in this run.
	UploadedBytes int64 `json:"uploadedBytes"`
	// SourceDigest is the sha256 of the original upload.
	SourceDigest string `json:"sourceDigest"`
	// VirtualSize and DiskFormat describe disk/disk.img.
	VirtualSize int64  `json:"virtualSize"`
	DiskFormat  string `json:"diskFormat"`
}

// IsAttachmentTag reports whether tag names something attached to an image
// rather than an image: the OCI referrers tag of a registry without the
// referrers API ("sha256-" and 64 hex digits, where the gate's verdicts and
// cosign's bundles are listed) and cosign's older ".sig", ".att" and
// ".sbom" tags after it. Listings hide them and neither the gate nor a
// syncer takes them for images.
func IsAttachmentTag(tag string) bool {
	rest, ok := strings.CutPrefix(tag, "sha256-")
	if !ok || len(rest) < 64 {
		return false
	}
	for _, c := range rest[:64] {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	switch rest[64:] {
	case "", ".sig", ".att", ".sbom":
		return true
	}
	return false
}

// ConvertResult is what `imagectl convert -o json` prints.
type ConvertResult struct {
	// Output is the file written.
	Output string `json:"output"`
	// Format is its format: qcow2 or raw.
	Format string `json:"format"`
	// VirtualSize is the guest disk size in bytes.
	VirtualSize int64 `json:"virtualSize"`
	// FileSize is the size of the file written, in bytes (for a sparse
	// raw file, its apparent size).
	FileSize int64 `json:"fileSize"`
}

// ExportResult is what `imagectl export -o json` prints.
type ExportResult struct {
	// File is the file written.
	File string `json:"file"`
	// Format is its format: qcow2 or raw.
	Format string `json:"format"`
	// VirtualSize is the guest disk size in bytes.
	VirtualSize int64 `json:"virtualSize"`
	// Reference is the image read, pinned by digest
	// ("registry/acme/rhel@sha256:...").
	Reference string `json:"reference"`
	// Platform is the image's platform (e.g. "linux/arm64"), when it
	// records one.
	Platform string `json:"platform,omitempty"`
}

// CopyResult is what `imagectl copy -o json` prints.
type CopyResult struct {
	// Source is the reference copied from, as given.
	Source string `json:"source"`
	// Reference is where the image now is, pinned by its digest
	// ("registry/acme/rhel@sha256:...").
	Reference string `json:"reference"`
	// Digest is the manifest digest, the same on both sides.
	Digest string `json:"digest"`
}

// DeleteResult is what `imagectl delete -o json` prints.
type DeleteResult struct {
	// Reference is the manifest deleted, pinned by digest.
	Reference string `json:"reference"`
	// Digest is its digest.
	Digest string `json:"digest"`
	// Untagged are the tags the registry removed with it.
	Untagged []string `json:"untagged"`
}

// LoginResult is what `imagectl login -o json` and `imagectl logout -o
// json` print.
type LoginResult struct {
	// Registry is the registry host.
	Registry string `json:"registry"`
	// Username is the user logged in as; empty for logout.
	Username string `json:"username,omitempty"`
	// ConfigFile is the docker config that holds (or held) the
	// credentials.
	ConfigFile string `json:"configFile"`
	// Changed is false for a logout from a registry without stored
	// credentials.
	Changed bool `json:"changed"`
}
