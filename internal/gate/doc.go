// Package gate is the server side's one check of what tenants push: it
// reads a pushed containerDisk in full, the way imagectl reads a disk,
// and publishes its canonical form, the only image hubs import.
//
// Verifier.Verify takes a digest in a tenant's repository (an image, or an
// index of up to 8 linux images) and reads every byte of it once:
//
//   - the manifest and config, strictly (internal/ocidoc): the registry's
//     Content-Type and the body agree, no key twice, no descriptor with
//     urls or embedded data, one layer, one diff ID, bounded annotations
//     and labels, and no environment but KubeVirt's instancetype defaults;
//   - the layer from the registry by digest: its bytes must show the
//     compression its media type names, its tar must hold exactly disk/
//     and disk/disk.img (107:107, 0444), with no header readers disagree
//     on, and nothing after them but zero padding, and its digest, size
//     and diff ID must match;
//   - the disk, through the disk engine's full verdict: header, every
//     table, shared clusters, every compressed cluster. A qcow2 disk that
//     is byte for byte what imagepipe's writer makes is checked as it
//     streams (convert.StreamCheck), with its tables in memory; any other
//     disk is spooled to a sparse file (at most its declared size, which
//     is bounded by the maximum virtual size) and verified there. A disk
//     whose tables are imagepipe's but whose data is not is read a second
//     time, into the spool.
//
// It then writes the canonical image into the same repository, by digest:
// a manifest and config of its own from the verified values, and the
// layer imagepipe's writer makes of the verified disk. The pushed blob is
// kept instead only when its tar is that layer's tar byte for byte and its
// compression framing (gzip member headers and count, zstd frames) is
// byte for byte what imagepipe's writers emit
// (containerdisk.LayerReader.OwnCompressionFraming); the coded data inside,
// which depends on the build's compressor, was decoded in full. So an
// image `imagectl import` built is its own canonical image and costs no
// storage, and CDI only ever reads imagepipe's tar in imagepipe's framing
// (docs/security.md, "The canonical image").
//
// A rejection is a verdict too, with the reason codes of internal/reject.
// Errors (a registry that fails, a context that ends) are not verdicts.
//
// Service runs verifications for the events of a registry: in turn per
// tenant, each in a child process of its own (Child) that is stopped past
// its memory limit, after the tenant's signature policy (TenantKeys), if
// any, found the signature it requires; the verdict is signed and attached
// by the service, and a refusal for want of a signature is looked at again
// when one is pushed.
package gate
