// Package source opens tenant disk images from local files, HTTP(S), S3 and
// stdin, unwrapping gzip, zstd and xz, for the disk engine.
//
// Open takes a spec: a local path, "-" for standard input, an http:// or
// https:// URL, or s3://bucket/key. It returns an Image: random access to
// the unwrapped bytes, the wrapper removed, and the SHA-256 of the original
// bytes as given, which Options.Checksum pins (a *ChecksumError otherwise).
// WaitDigest waits for a digest computed in the background (DeferDigest);
// UploadName names a local file's upload before its digest is known.
//
// An unwrapped local file is handed over as the *os.File itself, never
// copied. Its digest is remembered in a per-user cache, keyed by path,
// device, inode, size and times and ignored unless private to the user; a
// broken cache never fails Open. Every other source is read once, front to
// back, through the hasher and the decoder, into a sparse temporary file in
// Options.TempDir (4 KiB blocks of zeros are holes) or, with
// Options.StreamRaw and content that is not qcow2, through a count that
// keeps the first 1 MiB and the last 64 KiB (ErrNotSpooled in between). xz
// is decoded by the system's xz program (XZ Utils 5.2 or later) when it is
// in PATH, else in Go, with the same image, limits and verdicts.
//
// Three limits bound what Open stores:
//   - MaxSize caps the unwrapped bytes; a download announced larger fails
//     before its body is read;
//   - MaxSpool (DefaultMaxSpool unless set) caps a spool, holes included,
//     and a streamed image alike: past it, a reject.SpoolLimit rejection;
//   - at least SpoolMargin stays free in TempDir, else a *SpaceError.
//
// An HTTP(S) or S3 download cut by a network failure resumes with a Range
// request, at most three times, pinned to the object's ETag or
// Last-Modified: a changed object fails Open rather than splicing two
// versions, and an HTTP object with neither is not resumed. A download that
// fails for good, or a truncated or corrupt compressed stream, fails Open;
// it never passes for a shorter image.
//
// Errors name the source without a URL's password or query string.
// Rejections keep their *reject.Error in the chain; a network failure is
// never one. Temporary files are unlinked as soon as they are created, so
// none outlives the Image, a failed Open or a killed process. Why it works
// this way: docs/import.md, "How a source is read".
package source
