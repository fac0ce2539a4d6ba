// Package convert detects, validates and converts untrusted disk images
// (qcow2 and raw) natively: bytes in from an io.ReaderAt, bytes out to an
// io.Writer. It has no network and no Kubernetes code.
//
// # Detection
//
// Formats are detected by content only (Detect), never by file name: qcow2
// v2/v3 and raw are accepted; qcow v1, VMDK (sparse extents and text
// descriptors), VHD (dynamic and fixed), VHDX, VDI, QED, LUKS, Parallels,
// Bochs, cloop, Apple disk images (a "koly" trailer) and ISO 9660 are
// recognised so they can be refused precisely (ISO may be accepted as raw on
// request): every format QEMU's probing finds by content, so nothing QEMU
// would open as another format is accepted as raw. A file matching two
// formats is a polyglot and is refused, and so is content that contradicts
// a declared format (the CVE-2008-2004 class). The same class one step
// later: raw output (Plan with To: FormatRaw) is refused with
// reject.AmbiguousRaw when the guest disk's own first or last bytes match
// one of these signatures, since whoever reads the raw copy next would
// probe it as that format; qcow2 output names its format and is allowed.
// Unwrap recognises gzip, zstd and xz wrappers; Spool turns the stream into a
// sparse file with a size cap, since qcow2 needs random access.
//
// # Validation contract
//
// Open checks the qcow2 header as QEMU does at open time; Verify walks every
// L1/L2 entry the virtual size reaches and decompresses every compressed
// cluster once. Verify is the one verdict every command shares: Map is
// Verify and Plan runs it first, so inspect, import and a streamed convert
// refuse the same bytes for the same reason before any output is written
// or uploaded. WriteFile, which writes a file its caller discards on
// error, runs Verify's walk first, decompresses as it writes, and on a
// fault returns Verify's rejection. Refused, each with a typed
// *reject.Error carrying a Reason: backing files (any backing_file_offset,
// the backing-format extension), external data files (incompatible bit 2,
// the data-file extension), encryption (crypt_method, the LUKS extension),
// the corrupt bit, extended L2 entries (QEMU does not create them by
// default), unknown incompatible bits, cluster_bits outside 9..21, a bad
// header_length, extensions running past the first cluster, an L1 table over
// 32 MiB or too small for the virtual size, a refcount table over 8 MiB,
// more than 65536 snapshots, tables that are unaligned, beyond 2^56 or past
// the end of the file, data clusters and L2 tables past the end of the file,
// compressed clusters outside the file or not decompressing to exactly one
// cluster, a host cluster or compressed byte that the active tables use
// twice (see below), a qcow2 virtual size that is not a multiple of 512
// (QEMU would read only the whole sectors; qemu-img never writes one), and
// a virtual size above OpenOptions.MaxVirtualSize (2 TiB by default). Snapshots and bitmaps are ignored and never followed; refcounts
// are never read, so a dirty image converts correctly. Every length and
// offset is checked before it sizes an allocation: memory use is bounded by
// the limits above, not by what the file claims.
//
// # Work and output bounded by the file
//
// Tables could point many guest clusters at the same bytes: a 384 KiB file
// claiming 2 TiB of data, or one compressed stream decompressed a million
// times. Verify therefore refuses an image whose active tables (the L1
// entries the virtual size needs, their L2 tables, the clusters those
// reach) use a host cluster twice: the header cluster, the L1 and refcount
// tables, each L2 table and each data cluster have one use only
// (reject.SharedL2Table, reject.SharedCluster, reject.MetadataOverlap).
// QEMU packs compressed streams byte by byte, so a descriptor, rounded up
// to whole 512-byte sectors, legitimately reaches into the next stream.
// Instead, each compressed cluster must start at a byte of its own, its
// stream is read only up to the next start (or the end of its
// descriptor), and the bytes it may read lie on no cluster used otherwise.
// A stream must spend at least one byte per R guest bytes, R = 1032 for
// zlib and 32768 for zstd, the most each codec can do (checked, so the
// bound does not rest on the decoder); and all compressed clusters
// together may claim at most 1032 guest bytes per byte of the file
// (reject.CompressionRatio), deflate's limit, which only a zstd image made
// for it exceeds (e.g. 512 MiB of one repeated byte in 362 KiB).
//
// For a qcow2 file of F bytes with C-byte clusters that passes Verify:
//
//   - Verify reads at most 2F bytes: each table and stream once, and the L2
//     tables again to find the compressed clusters. Plan's scan and Write
//     read at most F bytes each.
//   - Each of these passes decompresses every compressed cluster at most
//     once: at most 1032·F/C clusters, 1032·F bytes of output.
//   - The guest data the image holds (what qcow2 output stores, and raw
//     output writes outside holes) is at most F bytes without compressed
//     clusters and at most 1033·F bytes with them. Raw output also spells
//     out the unallocated rest of the virtual size: holes in a file, zeros
//     in a stream.
//   - Memory: the image keeps two bits per host cluster, F/(4C) bytes (4
//     MiB for a 1 TiB file of 64 KiB clusters, 512 MiB for one of 512-byte
//     clusters), and the compressed clusters' starts, 8 bytes each or one
//     bit per byte of the file, whichever is smaller: min(8·count, F/8).
//
// F is the size of the image file itself; a compression wrapper around it
// (Unwrap) multiplies by its own ratio, which the spool limit bounds. A raw
// image of F bytes is its own data: F bytes rounded up to 512.
// inspect runs Verify; convert runs WriteFile (Verify's walk, then one
// pass); import runs Verify, Plan's scan and Write.
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
// of the disk. The second read usually comes from the page cache.
// Compressed input is decompressed twice on the way to a stream or a
// registry, by Verify, so that nothing is sent before the verdict, and by
// Write; WriteFile decompresses it once. Measured figures are in the
// README's benchmark table (make bench).
//
// Write reads the image in 2 MiB batches with several parallel readers
// (decompressing zlib — raw deflate — or zstd clusters in parallel) and
// writes them in guest order, so memory stays at a few batches whatever the
// disk size. Writing raw output to a regular file leaves 4 KiB blocks of
// zeros as holes, as qemu-img does.
package convert
