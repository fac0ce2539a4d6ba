package main

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/pkg/api"
)

type deleteOptions struct {
	*globalOptions
	registryFlags
	ref   string
	force bool
	out   outputFlags
}

func newDeleteCmd(g *globalOptions) *cobra.Command {
	o := &deleteOptions{globalOptions: g}
	cmd := &cobra.Command{
		Use:   "delete REGISTRY/TENANT/NAME:TAG|@DIGEST",
		Short: "Delete an image from a registry",
		Long: `Deletes the image a tag or digest names. Registries delete images by digest,
which removes every tag of the image with it; so deleting through a tag is
refused when other tags name the same image, unless --force is given. A digest
is deleted as asked.

The registry must allow deletes (distribution: storage.delete.enabled).
Blobs are freed by the registry's garbage collection.`,
		Example: `  imagectl delete registry.example.com/acme/rhel:10
  imagectl delete registry.example.com/acme/rhel@sha256:...`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.ref = args[0]
			return runDelete(cmd, o)
		},
	}
	addRegistryFlags(cmd, &o.registryFlags)
	addOutputFlag(cmd, &o.out, resultFormats...)
	cmd.Flags().BoolVar(&o.force, "force", false, "delete the image even when other tags name it (they are removed too)")
	return cmd
}

func runDelete(cmd *cobra.Command, o *deleteOptions) error {
	if err := o.out.validate(); err != nil {
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
	deleted, err := client.Delete(cmd.Context(), ref, registry.DeleteOptions{Force: o.force})
	var shared *registry.SharedImageError
	if errors.As(err, &shared) {
		return fmt.Errorf("%w; delete with --force to remove the image and all its tags", err)
	}
	if err != nil {
		return err
	}
	res := api.DeleteResult{Reference: deleted.Digest.String(), Digest: deleted.Digest.DigestStr(), Untagged: deleted.Tags}
	if res.Untagged == nil {
		res.Untagged = []string{}
	}
	return o.out.show(cmd.OutOrStdout(), view{data: res, names: []string{res.Reference}, table: func(w io.Writer, _ bool) error {
		if _, err := fmt.Fprintf(w, "deleted %s\n", deleted.Digest); err != nil || len(deleted.Tags) == 0 {
			return err
		}
		_, err := fmt.Fprintf(w, "untagged %s\n", strings.Join(deleted.Tags, ", "))
		return err
	}})
}
