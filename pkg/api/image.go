package api

// Verdicts of an image inspection.
const (
	VerdictAccepted = "accepted"
	VerdictRejected = "rejected"
)

// ImageReport is what `imagectl inspect -o json` prints for a disk image.
type ImageReport struct {
	// Source is the image as the user named it.
	Source string `json:"source"`
	// Wrapper is the compression around the file (gzip, zstd, xz), if any.
	Wrapper string `json:"wrapper,omitempty"`
	// Format is the detected disk format (raw, qcow2, vmdk, ...).
	Format string `json:"format"`
	// VirtualSize is the guest-visible disk size in bytes.
	VirtualSize int64 `json:"virtualSize,omitempty"`
	// FileSize is the size in bytes of the (unwrapped) image file.
	FileSize int64 `json:"fileSize"`
	// AllocatedSize is the guest bytes backed by stored data.
	AllocatedSize int64 `json:"allocatedSize,omitempty"`
	// ClusterSize is the qcow2 cluster size in bytes.
	ClusterSize int64 `json:"clusterSize,omitempty"`
	// Compat is the qcow2 compatibility level ("0.10" or "1.1").
	Compat string `json:"compat,omitempty"`
	// CompressionType is the qcow2 compression type ("zlib" or "zstd").
	CompressionType string `json:"compressionType,omitempty"`
	// CompressedClusters counts compressed qcow2 clusters.
	CompressedClusters int64 `json:"compressedClusters,omitempty"`
	// Verdict is VerdictAccepted or VerdictRejected.
	Verdict string `json:"verdict"`
	// Reasons explain a rejection.
	Reasons []Rejection `json:"reasons,omitempty"`
	// Guest is what the accepted disk holds, when it was read.
	Guest *GuestReport `json:"guest,omitempty"`
}

// Rejection is one reason an image was refused.
type Rejection struct {
	// Code is a stable machine-readable reason, e.g. "backing-file": one
	// of the codes of imagepipe's rejection taxonomy (internal/reject),
	// listed in docs/security.md.
	Code string `json:"code"`
	// Message is a sentence for people.
	Message string `json:"message"`
}

// Failure is what a command that fails prints on standard output under
// -o json or -o yaml, so that a script reading its output learns why; the
// message goes to standard error as well.
type Failure struct {
	Error FailureDetail `json:"error"`
}

// FailureDetail describes why a command failed.
type FailureDetail struct {
	// Code is a stable, machine-readable reason: a rejection code (see
	// Rejection) when validation refused the input, else one of
	// "usage", "not-found", "unauthorized", "denied", "unreachable",
	// "interrupted" or "error".
	Code string `json:"code"`
	// Message is the error as imagectl prints it.
	Message string `json:"message"`
	// Hint says what to do about it, when imagectl knows.
	Hint string `json:"hint,omitempty"`
	// Resumable says that running the same command again continues the
	// work instead of starting over.
	Resumable bool `json:"resumable,omitempty"`
	// ExitCode is the process's exit status.
	ExitCode int `json:"exitCode"`
}
