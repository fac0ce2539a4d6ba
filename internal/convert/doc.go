// Package convert detects, validates and converts untrusted disk images
// (qcow2 and raw) natively: bytes in from an io.ReaderAt, bytes out to an
// io.Writer. It has no network and no Kubernetes code.
//
// Detect finds the format by content only: qcow2 (v2, v3) and raw are
// accepted; every other format QEMU probes by content (and VHD footers,
// dmg trailers, ISO 9660) is recognised so it can be refused by name; a
// file that matches two formats, or contradicts a declared one, is refused.
// Unwrap removes a gzip, zstd or xz wrapper; Spool turns a stream into a
// sparse file under a size cap.
//
// Open checks a qcow2 header as QEMU does; Verify walks every L1/L2 entry
// the virtual size reaches and decompresses every compressed cluster once.
// Verify is the one verdict: Plan and WriteFile run it
// first, so every command refuses the same bytes for the same reason
// before anything is written. A refusal is a *reject.Error with a stable
// Reason; docs/security.md lists them (host-file references, encryption,
// unknown features, tables out of bounds, host clusters the active tables
// use twice, compression ratios over deflate's 1032:1, a virtual size over
// OpenOptions.MaxVirtualSize, 2 TiB by default). Snapshots, bitmaps and
// refcounts are never read.
//
// Bounds, for a qcow2 file of F bytes with C-byte clusters that passes
// Verify: Verify reads at most 2F bytes, and Plan's scan and Write at most
// F each; each pass decompresses at most 1032·F/C clusters (1032·F bytes);
// the guest data is at most F bytes, 1033·F with compressed clusters;
// memory is F/(4C) bytes of cluster bits plus min(8·compressed clusters,
// F/8). Every length and offset is checked before it sizes an allocation.
// A raw image of F bytes is its own data.
//
// Output is raw, or sparse qcow2 v3 (64 KiB clusters by default, no
// compression, snapshots, bitmaps or external files). Plan fixes the exact
// output size before Write writes its first byte, and Write emits the
// file in one sequential pass in guest order, so a tar header can precede
// it. Raw output whose guest disk starts or ends with another format's
// signature is refused (reject.AmbiguousRaw). docs/import.md ("How the
// disk is converted") explains the plan and its costs.
//
// StreamCheck recognises, in one pass and without storing it, a file that
// is exactly Write's qcow2 output for its own content, and verifies it
// from its tables (at most MaxStreamTables bytes held) and last sector.
package convert
