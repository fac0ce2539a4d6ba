// Package gate is the server side's one check of what tenants push: it
// reads a pushed containerDisk in full, the way imagectl reads a disk,
// and publishes its canonical form, the only image hubs import.
//
// Verifier.Verify takes a digest in a tenant's repository (an image, or an
// index of up to 8 linux images) and reads every byte once: the manifest
// and config strictly (internal/ocidoc), the layer by digest (its
// compression, tar shape, digest, size and diff ID), and the disk through
// the disk engine's full verdict (as it streams when it is imagepipe's own
// qcow2, convert.StreamCheck), and its guest (internal/guest), both from a
// sparse spool within the verification's share.
//
// It then writes the canonical image into the same repository, by digest:
// a manifest and config of its own and imagepipe's layer of the verified
// disk, or the pushed blob when its tar and compression framing are byte
// for byte imagepipe's (containerdisk.LayerReader.OwnCompressionFraming).
// So CDI only ever reads imagepipe's tar in imagepipe's framing. A rejection
// is a verdict too, with internal/reject's codes; an error (a failing
// registry, an ended context) is not.
//
// Service runs verifications for a registry's events: tenants in turn, each
// in a child process (Child) stopped past its memory limit, after the
// tenant's signature policy (TenantKeys); it signs and attaches verdicts and
// guest SBOMs (docs/security.md, "The gate"), and looks again at an unsigned
// refusal when a signature is pushed.
package gate
