// Package registry speaks the OCI distribution protocol: it pushes, pulls,
// lists, copies and deletes containerDisks, and polls repositories for
// new tags. It is the one package that opens connections to registries,
// on go-containerregistry (references, auth, manifests, listing, copying);
// internal/catalog keeps template artifacts through the oras-go client
// ORASRepository opens here. Three things are hand-written net/http
// because neither library offers them: the resumable chunked blob upload
// (a failed PATCH resumes from the bytes the registry acknowledged, also
// in a later run), the push check that opens and deletes an upload session
// before any work, and tag listing with ETags (so that polling an
// unchanged repository costs a 304).
//
// A reference is parsed once, by internal/imageref, into a Ref; the Client
// turns it into go-containerregistry's names, carrying its WithInsecure.
// The containerDisk format lives in internal/containerdisk: an import is
// handed a Disk that writes its own layer and a Source that gives the
// digest of the original bytes, so this package never reads a disk.
//
// An import is one streaming pass: the layer is compressed and uploaded in
// chunks while its digests are computed; the config and manifest go last,
// the tag with the manifest, so a failed import never leaves a tag on an
// incomplete image. Images are reproducible: the same source bytes and
// options give the same manifest digest, and an identical re-import finds
// the earlier image through its build key and only tags it.
package registry
