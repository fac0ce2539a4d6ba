package vmlaunch

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"
)

// TestParseSSHKeysRefusesPrivateKeys: a private key given where a public
// key belongs, in each form ssh-keygen and openssl write, alone or after a
// public key in the same file, is refused, and the error quotes no more of
// it than its armour line; the public half of each key is accepted.
func TestParseSSHKeysRefusesPrivateKeys(t *testing.T) {
	ed25519Pub, ed25519Key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	must := func(b *pem.Block, err error) []byte {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return pem.EncodeToMemory(b)
	}
	der := func(b []byte, err error) []byte {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	public := func(k crypto.PublicKey) []byte {
		t.Helper()
		pk, err := ssh.NewPublicKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return ssh.MarshalAuthorizedKey(pk)
	}
	for _, tc := range []struct {
		name        string
		private     []byte
		publicOfKey []byte
	}{
		{"OpenSSH ed25519", must(ssh.MarshalPrivateKey(ed25519Key, "alice@example.com")), public(ed25519Pub)},
		{"OpenSSH ed25519 with a passphrase", must(ssh.MarshalPrivateKeyWithPassphrase(ed25519Key, "", []byte("secret"))), public(ed25519Pub)},
		{"OpenSSH RSA", must(ssh.MarshalPrivateKey(rsaKey, "")), public(&rsaKey.PublicKey)},
		{"PKCS#1 RSA", pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(rsaKey)}), public(&rsaKey.PublicKey)},
		{"SEC 1 ECDSA", pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der(x509.MarshalECPrivateKey(ecKey))}), public(&ecKey.PublicKey)},
		{"PKCS#8 ed25519", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der(x509.MarshalPKCS8PrivateKey(ed25519Key))}), public(ed25519Pub)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if keys, err := ParseSSHKeys(tc.publicOfKey); err != nil || len(keys) != 1 {
				t.Fatalf("the public key: %q, %v; want it accepted", keys, err)
			}
			for what, file := range map[string][]byte{
				"alone":            tc.private,
				"after its public": append(append([]byte{}, tc.publicOfKey...), tc.private...),
			} {
				keys, err := ParseSSHKeys(file)
				if err == nil || !strings.Contains(err.Error(), "is not an SSH public key (is it the private key?)") {
					t.Errorf("the private key %s: %q, %v; want refused as a private key", what, keys, err)
					continue
				}
				for _, line := range strings.Split(string(tc.private), "\n")[1:] {
					if len(line) > 8 && !strings.HasPrefix(line, "-----END") && strings.Contains(err.Error(), line[:8]) {
						t.Errorf("the private key %s: the error %q quotes the key's body", what, err)
					}
				}
			}
		})
	}
}
