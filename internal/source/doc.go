// Package source opens tenant disk images from local files, HTTP(S), S3 and
// stdin, unwrapping gzip, zstd and xz, for the disk engine.
//
// Open takes a spec — a local path, "-" for standard input, an http:// or
// https:// URL, or s3://bucket/key — and returns an Image: random access to
// the image bytes (what internal/convert needs, since qcow2 is not a stream
// format), the compression wrapper that was removed, and the SHA-256 of the
// original bytes as given, which the published image records in its
// annotations and which Options.Checksum can pin. The Image is the one
// value an import hands to internal/registry about where its disk came
// from: WaitDigest gives the digest (DigestDeferred says whether it is
// still being computed) and UploadName names a local file's upload so an
// interrupted import resumes even before the digest is known.
//
// # Local files
//
// An unwrapped local file is handed over as the *os.File itself, so the disk
// engine can use SEEK_DATA/SEEK_HOLE and copy_file_range on it; nothing is
// copied. Its digest costs one sequential read, which the digest cache makes
// free on re-imports: digests.json in $IMAGEPIPE_CACHE, else
// $XDG_CACHE_HOME/imagepipe, else $HOME/.cache/imagepipe, keyed by absolute
// path, device, inode, size and the modification and change times in
// nanoseconds, holding the newest 1000 entries. The change time cannot be
// set from user space, so an edited file never hits a stale entry. The cache
// is an optimisation only: a missing, corrupt or unwritable cache never fails
// an import. A cache that is not private to the user (another owner, a
// group- or world-writable file or folder, a symbolic link) is ignored, since
// a digest planted there could let a different file pass Options.Checksum.
// A wrapped local file is unwrapped in the same sequential pass that
// computes its digest, and spooled or streamed like a stream (below).
//
// # Streams: stdin, HTTP(S), S3
//
// Everything else is read exactly once, front to back: the bytes go through
// the SHA-256 hasher, through convert.Unwrap when they are compressed, and
// then either into a sparse temporary file (convert.Spool) in
// Options.TempDir, or, with Options.StreamRaw, through a size count only.
// HTTP(S) and S3 downloads interrupted by a network failure
// are resumed with a Range request from the first byte not yet read (at most
// three times, with backoff), so the hash stays one continuous pass. A resume
// is pinned to the object's ETag or Last-Modified (If-Range, or If-Match for
// S3): an object changed in between fails Open rather than splicing two
// versions, and an HTTP download with neither is not resumed. A download
// that fails for good fails Open; it never passes for a shorter image. A
// Content-Length or S3 object size over MaxSize fails before the body is
// read.
//
// # TLS and S3 endpoints
//
// Options.CAFile adds CA certificates to the system's for https:// sources
// and S3 endpoints reached over HTTPS; Options.InsecureSkipVerify accepts any
// certificate there. An S3 endpoint given as a URL says itself whether it is
// HTTP or HTTPS; a bare host:port is HTTPS unless S3Options.Insecure. A
// certificate of an unknown CA fails an S3 request at once (minio-go would
// retry it for seconds).
//
// # xz
//
// An xz stream is decoded by the system's xz program when there is one in
// PATH, several times faster than the pure-Go decoder used otherwise, and
// the program writes the spool itself (see spoolXZ): the original bytes
// still pass through the hasher on their way to it (or, for a local file,
// alongside), the spool cap is the program's file size limit, and the spool
// gets the holes any spool gets. The decompressed bytes never cross a pipe,
// which would cost a sixth more time than the decoding. With
// Options.StreamRaw, which must write nothing to the temporary directory,
// the program writes into an anonymous memory file instead, read and freed
// just behind it (startXZ, xzRing): its output is counted and capped like
// any decoder's, the file holds at most 64 MiB not yet read (the program is
// stopped until the reader catches up), and runs of zeros are holes that
// cost neither memory nor a copy. Where no memory file can be made, the
// output goes through a pipe. Both decoders reject a truncated or corrupt
// stream, and garbage after it.
//
// # What is spooled, when
//
// The first 1 MiB of the unwrapped stream decides. A qcow2 image needs random
// access (its tables and clusters may be anywhere), so it is always spooled.
// Anything else is raw or a format detection rejects from its first 64 KiB
// and last 512 bytes; with Options.StreamRaw (imagectl inspect) it is not
// spooled at all: the head and the last 64 KiB are kept in memory, the size
// and the non-zero 4 KiB blocks are counted, and the Image's ReaderAt serves
// those two ends only (ErrNotSpooled in between). Without StreamRaw (convert
// and import, which read every byte again) it is spooled. A spool leaves 4 KiB
// blocks of zeros as holes, so it costs the image's data, not its size.
//
// Three limits bound a spool, so that a decompression bomb (a 260 KiB zstd
// file expanding to 8 GiB) or a lying server cannot fill the disk:
//   - Options.MaxSpool, DefaultMaxSpool (64 GiB) unless set: past it the image
//     is rejected with reject.SpoolLimit. 64 GiB holds the data of
//     every common cloud image and most full installed disks, and stops long
//     before an ordinary /tmp fills; the MaxSize default (the 2 TiB virtual
//     size limit plus metadata) would not. Larger images are better imported
//     from a local unwrapped file, which is never copied. The cap counts
//     image bytes, holes included, and applies to a streamed image too
//     (though nothing is written), so that inspect gives the verdict convert
//     and import would, and its work stays bounded.
//   - Free space: at least SpoolMargin (64 MiB) of TempDir's file system stays
//     free. When the final size is known (an unwrapped stream with a
//     Content-Length or an S3 object size), the cap and the free space
//     (statfs) are checked after the first 1 MiB, before the temporary file
//     exists; a compressed size tells nothing, so for wrapped sources and
//     stdin the free space is checked again every 8 MiB as the spool grows.
//     Either way the failure is a *SpaceError naming the directory and the
//     figures.
//   - MaxSize, as before, caps the unwrapped bytes whether spooled or
//     streamed.
//
// Spooling costs a temporary copy of the image even when the server supports
// Range requests and could serve the disk engine's random reads directly. But
// the digest of the original bytes is always needed, and computing it would
// cost a second full read over the network on top of the engine's reads; a
// ranged mode would only pay off for a server with ranges, an unwrapped
// object and no Options.Checksum to verify up front, and is not implemented.
//
// # Cleanup and errors
//
// Temporary files are unlinked as soon as they are created, so they vanish
// when the Image is closed, when Open fails, and even when the process is
// killed. Every error names the source ("opening https://host/disk.qcow2:
// ..."), with the password and query string of a URL left out since
// presigned URLs carry credentials there. Rejections from internal/convert (a
// nested wrapper, a stream over the cap) keep their *reject.Error in
// the chain, and so does a source over the cap before any byte is read
// (ReasonVirtualSize); a digest that does not match Options.Checksum is a
// *ChecksumError. A network failure is never reported as a rejection.
package source
