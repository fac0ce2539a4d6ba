// Package attest signs and verifies the statements imagepipe attaches to
// images: in-toto statements about one image digest, in a DSSE envelope,
// in a sigstore bundle (v0.3), signed with a key (no certificate, no
// transparency log). That is the shape `cosign attest --key` and, for
// image signatures, `cosign sign --key` write with cosign 3, so cosign
// verifies what imagepipe signs and imagepipe verifies what cosign signs.
//
// Signer signs with one private key: PKCS#8 or SEC 1 PEM, or a cosign
// encrypted key with its password; ECDSA P-256 or P-384, or Ed25519.
// Verifier checks a bundle against a set of public keys (several may be
// valid at once, for rotation), through sigstore-go: the signature, that
// the statement's subject is exactly the digest asked about, and its
// predicate type. Bundles are read only up to MaxBundleSize.
//
// The package knows nothing of registries: moving bundles is
// internal/registry's job.
package attest
