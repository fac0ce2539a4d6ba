// Package attest signs the statements imagepipe attaches to images:
// in-toto statements about one image digest, in a DSSE envelope, in a
// sigstore bundle (v0.3), signed with a key (no certificate, no
// transparency log). That is the shape `cosign attest --key` and, for
// image signatures, `cosign sign --key` write with cosign 3, so cosign
// verifies what imagepipe signs.
//
// Signer signs with one private key: PKCS#8 or SEC 1 PEM, or a cosign
// encrypted key with its password; ECDSA P-256 or P-384, or Ed25519.
// KeyChecker checks a bundle with the standard library alone, for showing
// a verdict to people; what hubs trust is decided by internal/trust,
// through sigstore-go. The package uses the standard library only, so
// that imagectl stays small.
package attest
