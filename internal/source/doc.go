// Package source opens tenant disk images from local files, HTTP(S), S3 and
// stdin, unwrapping gzip, zstd and xz, for the disk engine.
//
// Open takes a spec: a local path, "-" for standard input, an http:// or
// https:// URL, or s3://bucket/key. It returns an Image: random access to
// the unwrapped bytes, and the SHA-256 of the bytes as given, which
// Options.Checksum pins (a *ChecksumError otherwise) and WaitDigest waits
// for when it is computed in the background (Options.DeferDigest).
//
// An uncompressed local file is the *os.File itself, never copied. Every
// other source is read once, front to back, into a sparse temporary file in
// Options.TempDir or, with Options.StreamRaw and content that is not qcow2,
// through a count that keeps the first 1 MiB and the last 64 KiB
// (ErrNotSpooled in between). MaxSize caps the unwrapped bytes; MaxSpool
// (DefaultMaxSpool unless set) caps a spool or a stream, holes included (a
// reject.SpoolLimit rejection); SpoolMargin stays free in TempDir (a
// *SpaceError otherwise). Temporary files are unlinked once created, so
// none outlives the Image or the process. xz is decoded by the xz program
// (XZ Utils 5.2 or later) when in PATH, else in Go, with the same verdicts.
//
// A cut download resumes pinned to the object's version; a changed object,
// a download that fails for good, or a truncated or corrupt stream fails
// Open. Rejections keep their *reject.Error in the chain; a network failure
// is never one. Errors name no URL password or query. Design: docs/import.md.
package source
