// Package registry builds KubeVirt containerDisks and moves them to and from
// OCI registries. It is the only package that speaks the distribution
// protocol: go-containerregistry for references, auth, manifests and
// listing, and its own resumable chunked blob upload, which no library
// offers.
//
// An import is one streaming pass: the disk engine's output becomes the
// single file of a tar layer (disk/disk.img, 0444, owned 107:107), which is
// compressed and uploaded in chunks while its digests are computed. The
// config and manifest go last, and the tag is written with the manifest, so
// a failed import never leaves a tag pointing at an incomplete image.
//
// Images are reproducible: the same source bytes and options give the same
// manifest digest (fixed tar headers, deterministic compression, no
// timestamps unless asked for). An identical re-import finds the earlier
// image through its build key and only tags it.
package registry
