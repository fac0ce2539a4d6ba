// Package registry speaks the OCI distribution protocol, and is the one
// package that opens connections to registries: it resolves, fetches and
// pushes manifests and blobs, lists repositories, tags and referrers,
// copies, mounts and deletes, resolves an index to a platform's image,
// imports containerDisks and polls repositories for new tags. Reading a
// containerDisk back is internal/diskimage's, explaining failures to
// people cmd/imagectl's, credential files internal/credstore's.
//
// It is built on go-containerregistry; internal/catalog reaches artifacts
// through the oras-go client ORASRepository opens. Hand-written net/http
// serves what neither library offers: the resumable chunked upload (a
// failed PATCH resumes from the bytes the registry acknowledged, also in
// a later run), the push check that opens and deletes an upload session,
// and tag listing with ETags (polling an unchanged repository costs a 304).
//
// A reference is parsed once, by internal/imageref; Names turns its Ref
// into go-containerregistry's names, carrying --insecure into them.
//
// An import is one streaming pass: a Disk writes its layer while it is
// compressed, uploaded and hashed; the config and manifest (assembled by
// internal/containerdisk) go last, the tag with the manifest, so a failed
// import never leaves a tag on an incomplete image. Images are
// reproducible: the same source and options give the same manifest
// digest, and a re-import found through this machine's build record is
// only tagged.
package registry
