package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/spf13/cobra"

	"github.com/imagepipe/imagepipe/internal/attest"
	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/internal/verdict"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// keyPasswordEnv holds the password of a cosign-encrypted key, as for
// cosign itself.
const keyPasswordEnv = "COSIGN_PASSWORD"

type signOptions struct {
	*globalOptions
	registryFlags
	ref, key string
	out      outputFlags
}

func newSignCmd(g *globalOptions) *cobra.Command {
	o := &signOptions{globalOptions: g}
	cmd := &cobra.Command{
		Use:   "sign --key FILE REGISTRY/TENANT/NAME:TAG|@DIGEST",
		Short: "Sign an image in the registry, as cosign sign --key does",
		Long: `Signs the image a tag or digest names with a private key and attaches the
signature to its digest: an in-toto statement in a sigstore bundle, the
format of cosign 3, so that "cosign verify --key KEY.pub" accepts it. A
provider may require each tenant's images to carry a signature by one of
the tenant's keys before any hub imports them.

The key is a PEM private key (PKCS#8 or EC; ECDSA P-256 or P-384, or
Ed25519) or a key made by "cosign generate-key-pair", whose password is
read from $` + keyPasswordEnv + `.`,
		Example: `  imagectl sign --key cosign.key registry.example.com/acme/rhel:10
  imagectl import --sign-key cosign.key disk.qcow2 registry.example.com/acme/rhel:10`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.ref = args[0]
			return runSign(cmd, o)
		},
	}
	addRegistryFlags(cmd, &o.registryFlags)
	addOutputFlag(cmd, &o.out, resultFormats...)
	cmd.Flags().StringVar(&o.key, "key", "", "the private key to sign with (required)")
	_ = cmd.MarkFlagRequired("key")
	return cmd
}

func runSign(cmd *cobra.Command, o *signOptions) error {
	if err := o.out.validate(); err != nil {
		return err
	}
	signer, err := loadSigningKey(o.key)
	if err != nil {
		return err
	}
	client, err := o.registryFlags.client(o.globalOptions)
	if err != nil {
		return err
	}
	ref, err := o.registryFlags.parseImage(o.ref)
	if err != nil {
		return err
	}
	res, err := signImage(cmd.Context(), client, signer, ref)
	if err != nil {
		return err
	}
	return o.out.show(cmd.OutOrStdout(), view{data: res, names: []string{res.Reference}, table: func(w io.Writer, _ bool) error {
		_, err := fmt.Fprintf(w, "signed %s with key %s\n", res.Reference, res.KeyID)
		return err
	}})
}

// loadSigningKey reads a private key, with $COSIGN_PASSWORD for a
// cosign key.
func loadSigningKey(path string) (*attest.Signer, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the key: %w", err)
	}
	var password []byte
	if p, ok := os.LookupEnv(keyPasswordEnv); ok {
		password = []byte(p)
	}
	s, err := attest.LoadSigner(data, password)
	if errors.Is(err, attest.ErrPasswordNeeded) {
		return nil, fmt.Errorf("%s is an encrypted cosign key: set %s to its password", path, keyPasswordEnv)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// signImage signs the digest ref names and attaches the signature.
func signImage(ctx context.Context, client *registry.Client, signer *attest.Signer, ref name.Reference) (*api.SignResult, error) {
	raw, err := client.FetchManifest(ctx, ref)
	if err != nil {
		return nil, err
	}
	subject := ref.Context().Digest(raw.Digest)
	desc := ocispec.Descriptor{MediaType: string(raw.MediaType), Digest: digest.Digest(raw.Digest), Size: int64(len(raw.Bytes))}
	sig, err := verdict.Sign(ctx, client, signer, subject, desc)
	if err != nil {
		return nil, fmt.Errorf("signing %s: %w", subject, err)
	}
	return &api.SignResult{Reference: subject.String(), Digest: raw.Digest, Signature: sig, KeyID: signer.KeyID()}, nil
}
