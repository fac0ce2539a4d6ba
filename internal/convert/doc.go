// Package convert detects, validates and converts untrusted disk images
// (qcow2 and raw) natively: bytes in from an io.ReaderAt, bytes out to an
// io.Writer. It has no network and no Kubernetes code.
//
// Detect finds the format by content only, and refuses by name any other
// format QEMU probes, a polyglot and a contradicted declaration. Unwrap
// removes a gzip, zstd or xz wrapper; Spool spools a stream under a cap.
//
// Open checks a qcow2 header as QEMU does; Verify, the one verdict, walks
// every table entry the virtual size reaches and decompresses every
// compressed cluster once. Plan and WriteFile run it first, so every command
// refuses the same bytes for the same reason before writing anything: a
// *reject.Error with a stable Reason, listed with its why in docs/security.md.
//
// Bounds, for a qcow2 file of F bytes with C-byte clusters that passes
// Verify: Verify reads at most 2F bytes, Plan's scan and Write at most F
// each; the guest data is at most F bytes, 1033·F with compressed clusters,
// each pass decompressing at most 1032·F; memory is F/(4C) bytes of cluster
// bits plus min(8·compressed clusters, F/8).
//
// Output is raw, or sparse qcow2 v3 with nothing but tables and data. Plan
// fixes the exact output size before Write emits the file in one pass in
// guest order, so a tar header can precede it (docs/import.md). StreamCheck
// verifies in one pass, holding at most MaxStreamTables bytes, a file that
// is exactly Write's qcow2 output for its own content.
package convert
