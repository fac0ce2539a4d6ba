package attest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"

	"github.com/secure-systems-lab/go-securesystemslib/encrypted"
)

// PEM block types of the private keys LoadSigner reads.
const (
	pemPKCS8          = "PRIVATE KEY"
	pemSEC1           = "EC PRIVATE KEY"
	pemCosign         = "ENCRYPTED SIGSTORE PRIVATE KEY"
	pemCosignOld      = "ENCRYPTED COSIGN PRIVATE KEY"
	pemPublicKey      = "PUBLIC KEY"
	maxKeyFileSize    = 64 << 10
	errUnsupportedKey = "unsupported key type %T: attest signs with ECDSA P-256 or P-384, or Ed25519"
)

// ErrPasswordNeeded is returned by LoadSigner for a cosign encrypted key
// when no password was given.
var ErrPasswordNeeded = errors.New("the key is encrypted; a password is needed")

// Algorithm names how a key signs, in sigstore's terms.
type Algorithm string

// The algorithms attest signs and checks with.
const (
	ECDSAP256 Algorithm = "PKIX_ECDSA_P256_SHA_256"
	ECDSAP384 Algorithm = "PKIX_ECDSA_P384_SHA_384"
	Ed25519   Algorithm = "PKIX_ED25519"
)

// algorithm is how a key signs and the hash it signs (0: Ed25519 signs
// the message itself).
func algorithm(pub crypto.PublicKey) (Algorithm, crypto.Hash, error) {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		switch k.Curve {
		case elliptic.P256():
			return ECDSAP256, crypto.SHA256, nil
		case elliptic.P384():
			return ECDSAP384, crypto.SHA384, nil
		}
		return "", 0, fmt.Errorf("unsupported ECDSA curve %s: attest signs with P-256 or P-384", k.Curve.Params().Name)
	case ed25519.PublicKey:
		return Ed25519, crypto.Hash(0), nil
	}
	return "", 0, fmt.Errorf(errUnsupportedKey, pub)
}

// HashOf is the hash a key's signatures are made over; 0 for Ed25519.
func HashOf(pub crypto.PublicKey) (crypto.Hash, error) {
	_, h, err := algorithm(pub)
	return h, err
}

// KeyID is a public key's identifier: the standard base64 of the sha256
// of its PKIX DER form, the hint sigstore bundles carry.
func KeyID(pub crypto.PublicKey) (string, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(der)
	return base64.StdEncoding.EncodeToString(sum[:]), nil
}

// parsePrivateKey reads the first PEM block of data as a private key,
// decrypting a cosign key with password.
func parsePrivateKey(data, password []byte) (crypto.Signer, error) {
	if len(data) > maxKeyFileSize {
		return nil, fmt.Errorf("the key file is %d bytes, over the limit of %d", len(data), maxKeyFileSize)
	}
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, errors.New("the key file holds no PEM block")
	}
	der := block.Bytes
	switch block.Type {
	case pemCosign, pemCosignOld:
		if password == nil {
			return nil, ErrPasswordNeeded
		}
		plain, err := encrypted.Decrypt(block.Bytes, password)
		if err != nil {
			return nil, fmt.Errorf("decrypting the cosign key (wrong password?): %w", err)
		}
		der = plain
		fallthrough
	case pemPKCS8:
		k, err := x509.ParsePKCS8PrivateKey(der)
		if err != nil {
			return nil, fmt.Errorf("reading the private key: %w", err)
		}
		s, ok := k.(crypto.Signer)
		if !ok {
			return nil, fmt.Errorf(errUnsupportedKey, k)
		}
		return s, nil
	case pemSEC1:
		k, err := x509.ParseECPrivateKey(der)
		if err != nil {
			return nil, fmt.Errorf("reading the private key: %w", err)
		}
		return k, nil
	}
	return nil, fmt.Errorf("the key file holds a %q PEM block; want a private key (PKCS#8, EC, or a cosign key)", block.Type)
}

// ParsePublicKeys reads every PEM "PUBLIC KEY" block of data (a cosign
// .pub file holds one; a provider's key ring may hold several). Other
// blocks are an error, and so is a file without a key.
func ParsePublicKeys(data []byte) ([]crypto.PublicKey, error) {
	if len(data) > maxKeyFileSize {
		return nil, fmt.Errorf("the key file is %d bytes, over the limit of %d", len(data), maxKeyFileSize)
	}
	var keys []crypto.PublicKey
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type != pemPublicKey {
			return nil, fmt.Errorf("the key file holds a %q PEM block; want PUBLIC KEY blocks", block.Type)
		}
		k, err := x509.ParsePKIXPublicKey(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("reading a public key: %w", err)
		}
		if _, _, err := algorithm(k); err != nil {
			return nil, err
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil, errors.New("the key file holds no PUBLIC KEY block")
	}
	return keys, nil
}

// MarshalPublicKey is pub as a PEM "PUBLIC KEY" block, as cosign writes
// its .pub files.
func MarshalPublicKey(pub crypto.PublicKey) ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: pemPublicKey, Bytes: der}), nil
}
