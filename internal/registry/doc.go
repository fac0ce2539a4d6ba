// Package registry speaks the OCI distribution protocol, and is the one
// package that opens connections to registries: it fetches and puts
// manifests, uploads, mounts and reads blobs, lists repositories, tags and
// referrers, copies and deletes, resolves an index to a platform's image
// and adds an image to an index. What is pushed is decided elsewhere:
// containerDisks by internal/publish, artifacts by internal/verdict and
// internal/catalog (through the oras-go client ORASRepository opens);
// reading a containerDisk back is internal/diskimage's, explaining
// failures to people cmd/imagectl's, credential files internal/credstore's.
//
// It is built on go-containerregistry and oras-go. Hand-written net/http
// serves what neither offers: the resumable chunked upload (Upload: a
// failed PATCH resumes from the bytes the registry acknowledged, also in a
// later run, from state kept in the cache directory), the push check that
// opens and deletes an upload session, and tag listing with ETags
// (polling an unchanged repository costs a 304).
//
// A reference is parsed once, by internal/imageref; Names turns its Ref
// into go-containerregistry's names, carrying --insecure into them.
package registry
