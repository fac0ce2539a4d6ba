package convert

import (
	"errors"
	"fmt"
)

// Reason is a stable, machine-readable code saying why an image was rejected.
// Reasons are part of imagectl's JSON output and of the syncer's BaseImage
// status, so existing values must never change meaning.
type Reason string

// Rejection reasons. Each names one rule of the validation contract described
// in the package documentation.
const (
	// ReasonUnsupportedFormat: the content is a known disk format that
	// imagepipe does not accept (vmdk, vhd, vhdx, vdi, qed, qcow v1, ISO
	// without AllowISO, bzip2 wrapper).
	ReasonUnsupportedFormat Reason = "unsupported-format"
	// ReasonPolyglot: the content matches more than one format.
	ReasonPolyglot Reason = "polyglot"
	// ReasonFormatMismatch: the caller declared a format the content is not.
	ReasonFormatMismatch Reason = "format-mismatch"
	// ReasonEncrypted: LUKS container, qcow2 AES or qcow2 LUKS encryption.
	ReasonEncrypted Reason = "encrypted"
	// ReasonBackingFile: a qcow2 backing file is referenced.
	ReasonBackingFile Reason = "backing-file"
	// ReasonExternalDataFile: qcow2 guest data lives in an external file.
	ReasonExternalDataFile Reason = "external-data-file"
	// ReasonExternalReference: a descriptor (e.g. VMDK) names host files.
	ReasonExternalReference Reason = "external-reference"
	// ReasonUnknownFeature: an incompatible qcow2 feature bit we do not know.
	ReasonUnknownFeature Reason = "unknown-incompatible-feature"
	// ReasonExtendedL2: qcow2 subclusters (extended L2 entries).
	ReasonExtendedL2 Reason = "extended-l2"
	// ReasonCorrupt: the qcow2 corrupt bit is set.
	ReasonCorrupt Reason = "corrupt"
	// ReasonInvalidHeader: a header field is outside its valid range.
	ReasonInvalidHeader Reason = "invalid-header"
	// ReasonHeaderExtension: a header extension is malformed or oversized.
	ReasonHeaderExtension Reason = "invalid-header-extension"
	// ReasonL1Table: the L1 table is too large, too small or misplaced.
	ReasonL1Table Reason = "invalid-l1-table"
	// ReasonL2Table: an L2 table or an L2 entry is invalid or points outside the file.
	ReasonL2Table Reason = "invalid-l2-table"
	// ReasonRefcountTable: the refcount table is too large or misplaced.
	ReasonRefcountTable Reason = "invalid-refcount-table"
	// ReasonSnapshotTable: the snapshot table is too large or misplaced.
	ReasonSnapshotTable Reason = "invalid-snapshot-table"
	// ReasonCompressedCluster: a compressed cluster is misplaced or does
	// not decompress to exactly one cluster.
	ReasonCompressedCluster Reason = "invalid-compressed-cluster"
	// ReasonSharedL2Table: two L1 entries point to the same L2 table, so one
	// table of the file would describe several ranges of the disk.
	ReasonSharedL2Table Reason = "shared-l2-table"
	// ReasonSharedCluster: two guest clusters read the same host data: one
	// data cluster referenced twice, two compressed clusters starting at the
	// same byte, compressed data overlapping the next compressed cluster or
	// a data cluster. Each would let a small file expand into a large disk.
	ReasonSharedCluster Reason = "shared-cluster"
	// ReasonMetadataOverlap: an L2 table, a data cluster or compressed data
	// lies on qcow2 metadata (the header cluster, the L1 table, the refcount
	// table or an L2 table), or an L2 table on a data cluster.
	ReasonMetadataOverlap Reason = "metadata-overlap"
	// ReasonCompressionRatio: the compressed clusters claim more guest data
	// than 1032 bytes per byte of the file, deflate's limit, which a zstd
	// image can exceed only by being made to.
	ReasonCompressionRatio Reason = "compression-ratio"
	// ReasonVirtualSize: the virtual size is zero, not a multiple of 512
	// bytes (qcow2), or above the configured maximum.
	ReasonVirtualSize Reason = "virtual-size"
	// ReasonTruncated: the file ends before a structure it declares.
	ReasonTruncated Reason = "truncated"
	// ReasonAmbiguousRaw: raw output was asked for, but the guest disk's
	// own content matches another format's signature, so a raw copy would
	// be read as that format by the next tool that probes it.
	ReasonAmbiguousRaw Reason = "ambiguous-raw-output"
	// ReasonWrapper: a compression wrapper is corrupt or expands beyond its limit.
	ReasonWrapper Reason = "invalid-wrapper"
	// ReasonSpoolLimit: the image would need more temporary space than the
	// spool cap allows (a stream or a compressed file is copied to a
	// temporary file for random access).
	ReasonSpoolLimit Reason = "spool-limit"
)

// ErrRejected matches every *RejectError with errors.Is.
var ErrRejected = errors.New("image rejected")

// RejectError reports that an untrusted image breaks the validation contract.
// Nothing derived from a rejected image should be stored or published.
type RejectError struct {
	// Reason is the machine-readable code.
	Reason Reason
	// Detail is a human sentence naming the offending field and its value.
	Detail string
}

func (e *RejectError) Error() string {
	return fmt.Sprintf("image rejected (%s): %s", e.Reason, e.Detail)
}

// Is makes errors.Is(err, ErrRejected) true for every rejection.
func (e *RejectError) Is(target error) bool { return target == ErrRejected }

// reject builds a *RejectError with a formatted detail sentence.
func reject(reason Reason, format string, args ...any) *RejectError {
	return &RejectError{Reason: reason, Detail: fmt.Sprintf(format, args...)}
}

// AsReject returns the *RejectError in err's chain, or nil.
func AsReject(err error) *RejectError {
	var re *RejectError
	if errors.As(err, &re) {
		return re
	}
	return nil
}
