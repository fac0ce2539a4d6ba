// Package convert detects, validates and converts untrusted disk images
// (qcow2 and raw) natively: bytes in from an io.ReaderAt, bytes out to an
// io.Writer. It has no network and no Kubernetes code.
//
// # Detection
//
// Formats are detected by content only (Detect), never by file name: qcow2
// v2/v3 and raw are accepted; qcow v1, VMDK (sparse extents and text
// descriptors), VHD (dynamic and fixed), VHDX, VDI, QED, LUKS and ISO 9660 are
// recognised so they can be refused precisely (ISO may be accepted as raw on
// request). A file matching two formats is a polyglot and is refused, and so
// is content that contradicts a declared format (the CVE-2008-2004 class).
// Unwrap recognises gzip, zstd and xz wrappers; Spool turns the stream into a
// sparse file with a size cap, since qcow2 needs random access.
//
// # Validation contract
//
// Open checks the qcow2 header as QEMU does at open time, and Map, Plan and
// Write check every L1/L2 entry they reach. Refused, each with a typed
// *RejectError carrying a Reason: backing files (any backing_file_offset,
// the backing-format extension), external data files (incompatible bit 2,
// the data-file extension), encryption (crypt_method, the LUKS extension),
// the corrupt bit, extended L2 entries (QEMU does not create them by
// default), unknown incompatible bits, cluster_bits outside 9..21, a bad
// header_length, extensions running past the first cluster, an L1 table over
// 32 MiB or too small for the virtual size, a refcount table over 8 MiB,
// more than 65536 snapshots, tables that are unaligned, beyond 2^56 or past
// the end of the file, data clusters and L2 tables past the end of the file,
// compressed clusters outside the file or not decompressing to exactly one
// cluster, and a virtual size above OpenOptions.MaxVirtualSize (2 TiB by
// default). Snapshots and bitmaps are ignored and never followed; refcounts
// are never read, so a dirty image converts correctly. Every length and
// offset is checked before it sizes an allocation: memory use is bounded by
// the limits above, not by what the file claims.
//
// # Conversion and the allocation map
//
// Output is raw, or qcow2 v3 with 64 KiB clusters by default: uncompressed,
// no snapshots, bitmaps or external files, and sparse — clusters that are
// unallocated, zero-flagged, or allocated but all zero are not stored. The
// next layer streams the output into a tar entry whose header needs the size
// first, so Plan fixes the exact output size before Write writes the first
// byte, and Write then emits the file in one sequential pass:
//
//	header | L1 | refcount table | refcount blocks | L2 tables | data clusters
//
// Raw output needs no planning: its size is the virtual size. For qcow2
// output, Plan builds a bitmap with one bit per output cluster (4 MiB for a
// 2 TiB disk) from three sources, cheapest first:
//
//   - qcow2 L2 tables say which clusters are unallocated or zero-flagged,
//     without touching guest data;
//   - for raw files, SEEK_DATA/SEEK_HOLE says where the holes are, so holes
//     are never read;
//   - what remains is read and compared with zeros (bytes.Equal, vectorised),
//     in parallel. Compressed clusters are decompressed during this scan
//     only when their stored data is small enough to possibly be a zero
//     cluster (1/64 of a cluster); larger ones are counted as data.
//
// The trade-off: allocated data is read twice (scan, then Write) instead of
// spooling the converted output, which would cost a temporary copy the size
// of the disk. The second read usually comes from the page cache, and
// compressed input is decompressed once. Measured figures are in the
// README's benchmark table (make bench).
//
// Write reads the image in 2 MiB batches with several parallel readers
// (decompressing zlib — raw deflate — or zstd clusters in parallel) and
// writes them in guest order, so memory stays at a few batches whatever the
// disk size. Writing raw output to a regular file leaves 4 KiB blocks of
// zeros as holes, as qemu-img does.
package convert
