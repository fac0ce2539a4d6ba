package reject

import (
	"errors"
	"fmt"
)

// Reason is a stable, machine-readable code saying why an input was
// refused.
type Reason string

// Disk codes: each names one rule of the disk engine's validation contract
// (internal/convert's package documentation).
const (
	// UnsupportedFormat: the content is a known disk format that
	// imagepipe does not accept (vmdk, vhd, vhdx, vdi, qed, qcow v1, ISO
	// without AllowISO, bzip2 wrapper).
	UnsupportedFormat Reason = "unsupported-format"
	// Polyglot: the content matches more than one format.
	Polyglot Reason = "polyglot"
	// FormatMismatch: the caller declared a format the content is not.
	FormatMismatch Reason = "format-mismatch"
	// Encrypted: LUKS container, qcow2 AES or qcow2 LUKS encryption.
	Encrypted Reason = "encrypted"
	// BackingFile: a qcow2 backing file is referenced.
	BackingFile Reason = "backing-file"
	// ExternalDataFile: qcow2 guest data lives in an external file.
	ExternalDataFile Reason = "external-data-file"
	// ExternalReference: a descriptor (e.g. VMDK) names host files.
	ExternalReference Reason = "external-reference"
	// UnknownFeature: an incompatible qcow2 feature bit we do not know.
	UnknownFeature Reason = "unknown-incompatible-feature"
	// ExtendedL2: qcow2 subclusters (extended L2 entries).
	ExtendedL2 Reason = "extended-l2"
	// Corrupt: the qcow2 corrupt bit is set.
	Corrupt Reason = "corrupt"
	// InvalidHeader: a header field is outside its valid range.
	InvalidHeader Reason = "invalid-header"
	// HeaderExtension: a header extension is malformed or oversized.
	HeaderExtension Reason = "invalid-header-extension"
	// L1Table: the L1 table is too large, too small or misplaced.
	L1Table Reason = "invalid-l1-table"
	// L2Table: an L2 table or an L2 entry is invalid or points outside the file.
	L2Table Reason = "invalid-l2-table"
	// RefcountTable: the refcount table is too large or misplaced.
	RefcountTable Reason = "invalid-refcount-table"
	// SnapshotTable: the snapshot table is too large or misplaced.
	SnapshotTable Reason = "invalid-snapshot-table"
	// CompressedCluster: a compressed cluster is misplaced or does
	// not decompress to exactly one cluster.
	CompressedCluster Reason = "invalid-compressed-cluster"
	// SharedL2Table: two L1 entries point to the same L2 table, so one
	// table of the file would describe several ranges of the disk.
	SharedL2Table Reason = "shared-l2-table"
	// SharedCluster: two guest clusters read the same host data: one
	// data cluster referenced twice, two compressed clusters starting at the
	// same byte, compressed data overlapping the next compressed cluster or
	// a data cluster. Each would let a small file expand into a large disk.
	SharedCluster Reason = "shared-cluster"
	// MetadataOverlap: an L2 table, a data cluster or compressed data
	// lies on qcow2 metadata (the header cluster, the L1 table, the refcount
	// table or an L2 table), or an L2 table on a data cluster.
	MetadataOverlap Reason = "metadata-overlap"
	// CompressionRatio: the compressed clusters claim more guest data
	// than 1032 bytes per byte of the file, deflate's limit, which a zstd
	// image can exceed only by being made to.
	CompressionRatio Reason = "compression-ratio"
	// VirtualSize: the virtual size is zero, not a multiple of 512
	// bytes (qcow2), or above the configured maximum.
	VirtualSize Reason = "virtual-size"
	// Truncated: the file ends before a structure it declares.
	Truncated Reason = "truncated"
	// AmbiguousRaw: raw output was asked for, but the guest disk's
	// own content matches another format's signature, so a raw copy would
	// be read as that format by the next tool that probes it.
	AmbiguousRaw Reason = "ambiguous-raw-output"
	// Wrapper: a compression wrapper is corrupt or expands beyond its limit.
	Wrapper Reason = "invalid-wrapper"
	// SpoolLimit: the image would need more temporary space than the
	// spool cap allows (a stream or a compressed file is copied to a
	// temporary file for random access).
	SpoolLimit Reason = "spool-limit"
	// VerificationLimit: the gate's verification of the image went past
	// its memory limit, time after time.
	VerificationLimit Reason = "verification-limit"
)

// Platform code: the image in a registry is for another machine.
const (
	// PlatformMismatch: the image's architecture is not the hub's, or an
	// image index holds no image for it.
	PlatformMismatch Reason = "platform-mismatch"
	// UnknownGuest: the gate could not tell which operating system the
	// disk holds, and the hub imports only images whose guest it knows
	// (image-syncer --unknown-guests hold). The gate never refuses an
	// image for it.
	UnknownGuest Reason = "unknown-guest"
	// NotBooted: the gate's boot check did not see the disk boot, or did
	// not run, and the hub imports only images that booted (image-syncer
	// --require-boot). The gate never refuses an image for it.
	NotBooted Reason = "not-booted"
)

// Shape codes: the image in a registry is not a containerDisk of the shape
// imagepipe builds — one layer holding exactly the directory disk/ and the
// file disk/disk.img, 0444 and owned by 107:107.
const (
	// LayerCount: the image has no layer or more than one.
	LayerCount Reason = "layer-count"
	// LayerMediaType: the layer is not a tar (plain, gzip or zstd).
	LayerMediaType Reason = "layer-media-type"
	// InvalidLayer: the layer does not decompress or is not a valid tar.
	InvalidLayer Reason = "invalid-layer"
	// TarEntry: an entry other than disk/ and disk/disk.img, or one of the
	// wrong type.
	TarEntry Reason = "unexpected-tar-entry"
	// DiskOwner: disk/disk.img is not owned by 107:107.
	DiskOwner Reason = "disk-owner"
	// DiskMode: disk/disk.img's mode is not 0444.
	DiskMode Reason = "disk-mode"
	// AnnotationMismatch: an io.imagepipe annotation contradicts the disk.
	AnnotationMismatch Reason = "annotation-mismatch"
	// ManifestShape: a manifest, index or config that readers could take
	// two ways: a media type its body contradicts, a descriptor with urls
	// or embedded data, a diff ID that is not the layer's, a field out of
	// bounds.
	ManifestShape Reason = "manifest-shape"
)

// Signature codes: the tenant requires its images to be signed (the gate's
// per-tenant policy) and this one is not. The image itself was not read.
const (
	// Unsigned: no signature is attached to the pushed digest.
	Unsigned Reason = "unsigned"
	// UntrustedSignature: signatures are attached, but none by one of the
	// tenant's keys, about this digest.
	UntrustedSignature Reason = "untrusted-signature"
)

// IsSignature reports whether r says the image lacks the signature its
// tenant requires: a rejection that a signature pushed later lifts.
func (r Reason) IsSignature() bool { return r == Unsigned || r == UntrustedSignature }

// shapeReasons are the codes about the containerDisk around a disk.
var shapeReasons = map[Reason]bool{
	LayerCount: true, LayerMediaType: true, InvalidLayer: true, TarEntry: true,
	DiskOwner: true, DiskMode: true, AnnotationMismatch: true, ManifestShape: true,
}

// IsShape reports whether r is about the containerDisk's shape rather than
// the disk inside it.
func (r Reason) IsShape() bool { return shapeReasons[r] }

// ErrRejected matches every *Error with errors.Is.
var ErrRejected = errors.New("image rejected")

// Error reports that an untrusted input breaks the validation contract.
// Nothing derived from a rejected input is stored or published.
type Error struct {
	// Reason is the machine-readable code.
	Reason Reason
	// Detail is a sentence for people naming the offending field and its
	// value.
	Detail string
}

func (e *Error) Error() string {
	if e.Reason.IsShape() {
		return fmt.Sprintf("not a containerDisk (%s): %s", e.Reason, e.Detail)
	}
	return fmt.Sprintf("image rejected (%s): %s", e.Reason, e.Detail)
}

// Is makes errors.Is(err, ErrRejected) true for every rejection.
func (e *Error) Is(target error) bool { return target == ErrRejected }

// New returns an *Error with a formatted detail sentence.
func New(reason Reason, format string, args ...any) *Error {
	return &Error{Reason: reason, Detail: fmt.Sprintf(format, args...)}
}

// As returns the *Error in err's chain, or nil.
func As(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return nil
}
