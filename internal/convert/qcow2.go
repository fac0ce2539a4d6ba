package convert

import (
	"encoding/binary"
	"fmt"

	"github.com/imagepipe/imagepipe/internal/reject"
)

// qcow2 on-disk constants, from QEMU's docs/interop/qcow2.rst.
const (
	qcowMagic = 0x514649fb // "QFI\xfb"

	qcowV2HeaderLen = 72  // version 2 header size; no header_length field
	qcowV3MinHeader = 104 // smallest valid version 3 header_length

	minClusterBits = 9  // 512 B, QEMU's MIN_CLUSTER_BITS
	maxClusterBits = 21 // 2 MiB, QEMU's MAX_CLUSTER_BITS

	// maxL1Bytes and maxRefcountTableBytes are QEMU's QCOW_MAX_L1_SIZE and
	// QCOW_MAX_REFTABLE_SIZE: larger tables are refused at open.
	maxL1Bytes            = 32 << 20
	maxRefcountTableBytes = 8 << 20
	// maxSnapshots is QEMU's QCOW_MAX_SNAPSHOTS.
	maxSnapshots = 65536
	// maxHostOffset: every host offset in a qcow2 file is below 2^56.
	maxHostOffset = 1 << 56

	// Incompatible feature bits.
	incompatDirty        = 1 << 0
	incompatCorrupt      = 1 << 1
	incompatDataFile     = 1 << 2
	incompatCompression  = 1 << 3
	incompatExtendedL2   = 1 << 4
	incompatKnownToQEMU  = incompatDirty | incompatCorrupt | incompatDataFile | incompatCompression | incompatExtendedL2
	compressionZlib      = 0
	compressionZstd      = 1
	maxRefcountOrder     = 6
	defaultRefcountOrder = 4

	// Header extension types.
	extEnd           = 0x00000000
	extBackingFormat = 0xe2792aca
	extFeatureTable  = 0x6803f857
	extBitmaps       = 0x23852875
	extEncryption    = 0x0537be77
	extDataFile      = 0x44415441

	// L1/L2 entry bits.
	entryCopied     = 1 << 63
	entryCompressed = 1 << 62
	entryZero       = 1 << 0
	// l1OffsetMask selects bits 9..55: the cluster-aligned L2 table offset.
	l1OffsetMask = 0x00fffffffffffe00
	// l1Reserved is every L1 bit that must be zero.
	l1Reserved = 0x7f000000000001ff
	// l2OffsetMask selects bits 9..55 of a standard cluster descriptor.
	l2OffsetMask = 0x00fffffffffffe00
)

// qcowHeader is the validated qcow2 header.
type qcowHeader struct {
	version         uint32
	clusterBits     uint32
	size            uint64 // virtual size in bytes
	l1Size          uint32
	l1Offset        uint64
	refTableOffset  uint64
	refTableCluster uint32
	nbSnapshots     uint32
	snapshotsOffset uint64
	incompatible    uint64
	compatible      uint64
	autoclear       uint64
	refcountOrder   uint32
	headerLength    uint32
	compression     uint8
	hasBitmaps      bool // bitmaps extension present (ignored, never followed)
}

func (h *qcowHeader) clusterSize() int64 { return 1 << h.clusterBits }

// l2Entries is the number of entries in one L2 table.
func (h *qcowHeader) l2Entries() int64 { return h.clusterSize() / 8 }

// l1Needed is the number of L1 entries the virtual size requires.
func (h *qcowHeader) l1Needed() uint64 {
	span := uint64(h.clusterSize()) * uint64(h.l2Entries())
	return (h.size + span - 1) / span
}

// compressionName is the header's compression type as qemu-img names it.
func (h *qcowHeader) compressionName() string {
	if h.compression == compressionZstd {
		return "zstd"
	}
	return "zlib"
}

// parseQCOW2Header validates the qcow2 header and its extensions. head holds
// the start of the file: at least the first cluster, or the whole file when
// it is shorter. fileSize is the full file size and maxVirtual the largest
// virtual size accepted. Every field is checked before it is used, in a
// fixed order, so that one image always gets the same first reason.
func parseQCOW2Header(head []byte, fileSize, maxVirtual int64) (*qcowHeader, error) {
	h, err := decodeQCOW2Header(head)
	if err != nil {
		return nil, err
	}
	be := binary.BigEndian
	if err := h.checkNothingExternal(be.Uint64(head[8:]), be.Uint32(head[32:])); err != nil {
		return nil, err
	}
	if err := h.checkCompression(head); err != nil {
		return nil, err
	}
	if err := h.checkVirtualSize(maxVirtual); err != nil {
		return nil, err
	}
	if err := h.checkTables(fileSize); err != nil {
		return nil, err
	}
	if err := h.parseExtensions(head); err != nil {
		return nil, err
	}
	return h, nil
}

// decodeQCOW2Header reads the header fields and checks the version, the
// cluster size and the header length, which every later check relies on.
func decodeQCOW2Header(head []byte) (*qcowHeader, error) {
	if len(head) < qcowV2HeaderLen {
		return nil, reject.New(reject.Truncated, "the file is %d bytes, shorter than a qcow2 header (%d bytes)", len(head), qcowV2HeaderLen)
	}
	be := binary.BigEndian
	if be.Uint32(head[0:]) != qcowMagic {
		return nil, reject.New(reject.InvalidHeader, "the qcow2 magic is missing")
	}
	h := &qcowHeader{
		version:         be.Uint32(head[4:]),
		clusterBits:     be.Uint32(head[20:]),
		size:            be.Uint64(head[24:]),
		l1Size:          be.Uint32(head[36:]),
		l1Offset:        be.Uint64(head[40:]),
		refTableOffset:  be.Uint64(head[48:]),
		refTableCluster: be.Uint32(head[56:]),
		nbSnapshots:     be.Uint32(head[60:]),
		snapshotsOffset: be.Uint64(head[64:]),
		refcountOrder:   defaultRefcountOrder,
		headerLength:    qcowV2HeaderLen,
	}
	if h.version != 2 && h.version != 3 {
		return nil, reject.New(reject.UnsupportedFormat, "qcow2 version %d is not supported (only 2 and 3)", h.version)
	}
	if h.version == 3 {
		if len(head) < qcowV3MinHeader {
			return nil, reject.New(reject.Truncated, "the file is %d bytes, shorter than a qcow2 v3 header", len(head))
		}
		h.incompatible = be.Uint64(head[72:])
		h.compatible = be.Uint64(head[80:])
		h.autoclear = be.Uint64(head[88:])
		h.refcountOrder = be.Uint32(head[96:])
		h.headerLength = be.Uint32(head[100:])
	}
	if h.clusterBits < minClusterBits || h.clusterBits > maxClusterBits {
		return nil, reject.New(reject.InvalidHeader, "cluster_bits is %d; it must be between %d and %d", h.clusterBits, minClusterBits, maxClusterBits)
	}
	if h.version == 3 {
		if h.headerLength < qcowV3MinHeader || h.headerLength%8 != 0 {
			return nil, reject.New(reject.InvalidHeader, "header_length is %d; a version 3 header is at least %d bytes and a multiple of 8", h.headerLength, qcowV3MinHeader)
		}
		if int64(h.headerLength) > h.clusterSize() {
			return nil, reject.New(reject.InvalidHeader, "header_length %d exceeds the cluster size %d", h.headerLength, h.clusterSize())
		}
		if int64(h.headerLength) > int64(len(head)) {
			return nil, reject.New(reject.Truncated, "the file ends inside the %d-byte header", h.headerLength)
		}
	}
	return h, nil
}

// checkNothingExternal refuses every way an image can pull in data from
// elsewhere or hide it: a backing file, encryption, an external data file,
// and feature bits that change how the file is read.
func (h *qcowHeader) checkNothingExternal(backingOffset uint64, cryptMethod uint32) error {
	if backingOffset != 0 {
		return reject.New(reject.BackingFile, "the image references a backing file (backing_file_offset %#x); flatten it with 'qemu-img convert' or 'qemu-img rebase -b \"\"'", backingOffset)
	}
	if cryptMethod != 0 {
		name := map[uint32]string{1: "AES"}[cryptMethod]
		if name == "" {
			name = fmt.Sprintf("method %d", cryptMethod)
			if cryptMethod == 2 {
				name = "LUKS"
			}
		}
		return reject.New(reject.Encrypted, "the image is encrypted (%s); upload the decrypted disk", name)
	}
	if h.incompatible&incompatCorrupt != 0 {
		return reject.New(reject.Corrupt, "the image is marked corrupt; repair it with 'qemu-img check -r all' and upload the result")
	}
	if h.incompatible&incompatDataFile != 0 {
		return reject.New(reject.ExternalDataFile, "the image keeps its data in an external data file")
	}
	if h.incompatible&incompatExtendedL2 != 0 {
		return reject.New(reject.ExtendedL2, "the image uses extended L2 entries (subclusters), which qemu-img does not create by default; convert it with 'qemu-img convert -O qcow2'")
	}
	if unknown := h.incompatible &^ incompatKnownToQEMU; unknown != 0 {
		return reject.New(reject.UnknownFeature, "the image sets unknown incompatible feature bits %#x", unknown)
	}
	return nil
}

// checkCompression checks a version 3 header's refcount order and
// compression type (version 2 has neither: 16-bit refcounts and zlib).
func (h *qcowHeader) checkCompression(head []byte) error {
	if h.version != 3 {
		return nil
	}
	if h.refcountOrder > maxRefcountOrder {
		return reject.New(reject.InvalidHeader, "refcount_order is %d; the maximum is %d", h.refcountOrder, maxRefcountOrder)
	}
	if h.headerLength > qcowV3MinHeader {
		h.compression = head[104]
	}
	if h.incompatible&incompatCompression == 0 && h.compression != compressionZlib {
		return reject.New(reject.InvalidHeader, "compression_type is %d but the compression-type feature bit is not set", h.compression)
	}
	if h.compression != compressionZlib && h.compression != compressionZstd {
		return reject.New(reject.InvalidHeader, "compression_type %d is unknown (0 zlib, 1 zstd)", h.compression)
	}
	return nil
}

// checkVirtualSize checks the guest disk size against zero, whole sectors
// and the configured maximum.
func (h *qcowHeader) checkVirtualSize(maxVirtual int64) error {
	if h.size == 0 {
		return reject.New(reject.VirtualSize, "the virtual size is zero")
	}
	if h.size%512 != 0 {
		// QEMU reads whole sectors only: it would show the guest the first
		// size&^511 bytes, and qemu-img never writes such a size.
		return reject.New(reject.VirtualSize, "the virtual size %d bytes is not a multiple of 512; QEMU would read only the first %d bytes", h.size, h.size&^511)
	}
	if h.size > uint64(maxVirtual) {
		return reject.New(reject.VirtualSize, "the virtual size %d bytes exceeds the limit of %d bytes", h.size, maxVirtual)
	}
	return nil
}

// checkTables validates the placement and size of the L1, refcount and
// snapshot tables.
func (h *qcowHeader) checkTables(fileSize int64) error {
	cs := uint64(h.clusterSize())
	if uint64(h.l1Size)*8 > maxL1Bytes {
		return reject.New(reject.L1Table, "l1_size %d entries exceeds QEMU's limit of %d bytes", h.l1Size, maxL1Bytes)
	}
	if need := h.l1Needed(); uint64(h.l1Size) < need {
		return reject.New(reject.L1Table, "l1_size %d is too small for the virtual size %d (needs %d entries)", h.l1Size, h.size, need)
	}
	if err := checkTableOffset(reject.L1Table, "L1 table", h.l1Offset, h.l1Needed()*8, cs, fileSize); err != nil {
		return err
	}
	if uint64(h.refTableCluster)*cs > maxRefcountTableBytes {
		return reject.New(reject.RefcountTable, "the refcount table spans %d clusters, over QEMU's limit of %d bytes", h.refTableCluster, maxRefcountTableBytes)
	}
	if h.refTableCluster == 0 {
		return reject.New(reject.RefcountTable, "the refcount table is empty")
	}
	// The refcount table is never read; its start must still be a valid
	// position inside the file.
	if err := checkTableOffset(reject.RefcountTable, "refcount table", h.refTableOffset, 1, cs, fileSize); err != nil {
		return err
	}
	if h.nbSnapshots > maxSnapshots {
		return reject.New(reject.SnapshotTable, "the image claims %d snapshots, over QEMU's limit of %d", h.nbSnapshots, maxSnapshots)
	}
	if h.nbSnapshots > 0 {
		// Snapshots are ignored and never followed; the table must still
		// be where a valid image would keep it.
		if err := checkTableOffset(reject.SnapshotTable, "snapshot table", h.snapshotsOffset, 1, cs, fileSize); err != nil {
			return err
		}
	}
	return nil
}

// checkTableOffset checks that a table of n bytes at off is cluster-aligned,
// below 2^56 and inside the file.
func checkTableOffset(reason reject.Reason, what string, off, n, clusterSize uint64, fileSize int64) error {
	switch {
	case off == 0 || off%clusterSize != 0:
		return reject.New(reason, "the %s offset %#x is not a non-zero multiple of the cluster size", what, off)
	case off >= maxHostOffset:
		return reject.New(reason, "the %s offset %#x is beyond 2^56", what, off)
	case off+n > uint64(fileSize):
		return reject.New(reason, "the %s (%d bytes at %#x) lies past the end of the %d-byte file", what, n, off, fileSize)
	}
	return nil
}

// parseExtensions walks the header extensions, which must end within the
// first cluster. Unknown extensions are skipped as the spec requires; the
// ones that pull in outside data are refused.
func (h *qcowHeader) parseExtensions(head []byte) error {
	be := binary.BigEndian
	end := min(int64(len(head)), h.clusterSize())
	off := int64(h.headerLength)
	for off+8 <= end {
		typ := be.Uint32(head[off:])
		length := int64(be.Uint32(head[off+4:]))
		// The length first, even the end mark's: QEMU refuses to open the
		// image otherwise.
		dataEnd := off + 8 + length
		if dataEnd > h.clusterSize() {
			return reject.New(reject.HeaderExtension, "header extension %#x at offset %d claims %d bytes, past the end of the first cluster", typ, off, length)
		}
		if typ == extEnd {
			return nil
		}
		switch typ {
		case extBackingFormat:
			return reject.New(reject.BackingFile, "the image carries a backing file format extension")
		case extEncryption:
			return reject.New(reject.Encrypted, "the image carries a full-disk encryption header extension")
		case extDataFile:
			return reject.New(reject.ExternalDataFile, "the image names an external data file")
		case extBitmaps:
			h.hasBitmaps = true
		case extFeatureTable:
			if length%48 != 0 {
				return reject.New(reject.HeaderExtension, "the feature name table is %d bytes, not a multiple of 48", length)
			}
		}
		off = (dataEnd + 7) &^ 7
	}
	return nil
}
