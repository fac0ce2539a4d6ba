// Package registry speaks the OCI distribution protocol: it pushes, pulls,
// lists, copies and deletes containerDisks, and polls repositories for
// new tags. It is the one package that opens connections to registries,
// on go-containerregistry (references, auth, manifests, listing, copying);
// internal/catalog keeps template artifacts through the oras-go client
// ORASRepository opens here. Three things are hand-written net/http
// because neither library offers them: the resumable chunked blob upload
// (a PATCH that fails resumes from the bytes the registry acknowledged,
// also in a later run), the push check that opens and deletes an upload
// session before any work, and tag listing with ETags (conditional
// requests, so that polling an unchanged repository costs a 304).
//
// A reference given as text is parsed once, by internal/imageref, into a
// Ref of plain strings; the Client turns a Ref into go-containerregistry's
// names (Reference, Repository, Registry), carrying its WithInsecure into
// them.
//
// The containerDisk format itself (the layer's tar, its compression, the
// shape check) lives in internal/containerdisk; an import is handed a
// Disk that writes its own layer and a Source that gives the digest of
// the original bytes, so this package never reads a disk.
//
// An import is one streaming pass: the layer is compressed and uploaded in
// chunks while its digests are computed. The config and manifest go last,
// and the tag is written with the manifest, so a failed import never
// leaves a tag pointing at an incomplete image.
//
// Images are reproducible: the same source bytes and options give the same
// manifest digest. An identical re-import finds the earlier image through
// its build key and only tags it.
package registry
