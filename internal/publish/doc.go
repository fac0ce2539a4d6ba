// Package publish pushes containerDisks: imagectl's import, and the image
// writing that the gate's canonical image shares with it, so that the two
// write the same bytes the same way.
//
// An import (Importer.Import) is one streaming pass: the Disk writes its
// layer while internal/registry's resumable upload sends and the digests
// are computed; the config and the manifest (assembled by
// internal/containerdisk) go last, the tag with the manifest (Image), so
// a failed import never leaves a tag on an incomplete image. A rejected
// disk leaves nothing on the registry; an interrupted upload is resumed by
// the next run of the same import, also before the source's digest is
// known (Source.UploadName).
//
// Images are reproducible: the same source and options give the same
// manifest digest (the build key records what decides it). A re-import
// is only tagged when this machine's build record says it pushed that
// build and the registry still holds exactly that manifest and its blobs:
// nothing found in a registry alone is trusted. With ImportOptions.Append
// the image joins the index at the tag instead of replacing it.
package publish
