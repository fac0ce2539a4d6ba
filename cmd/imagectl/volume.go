package main

import (
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/imagepipe/imagepipe/internal/vmlaunch"
)

func newVolumeCmd(g *globalOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "volume",
		Short: "Data volumes whose life is independent of any VM",
	}
	groupCommand(cmd)
	cmd.AddCommand(newVolumeCreateCmd(g), newVolumeListCmd(g), newVolumeDeleteCmd(g))
	return cmd
}

type volumeCreateOptions struct {
	*globalOptions
	kubeFlags
	size, storageClass string
}

func newVolumeCreateCmd(g *globalOptions) *cobra.Command {
	o := &volumeCreateOptions{globalOptions: g}
	cmd := &cobra.Command{
		Use:   "create NAME --size QUANTITY",
		Short: "Create a blank data volume (ReadWriteMany when the storage allows) to attach to VMs",
		Example: `  imagectl volume create data1 --size 50Gi
  imagectl vm attach-volume web data1`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: cobra.NoFileCompletions, // a new name
		RunE:              func(cmd *cobra.Command, args []string) error { return runVolumeCreate(cmd, o, args[0]) },
	}
	cmd.Flags().StringVar(&o.size, "size", "", "size, e.g. 50Gi (required)")
	cmd.Flags().StringVar(&o.storageClass, "storage-class", "", "StorageClass (default: the cluster's default)")
	_ = cmd.MarkFlagRequired("size")
	addKubeFlags(cmd, &o.kubeFlags)
	return cmd
}

func runVolumeCreate(cmd *cobra.Command, o *volumeCreateOptions, name string) error {
	size, err := resource.ParseQuantity(o.size)
	if err != nil {
		return fmt.Errorf("--size %q: want a quantity such as 50Gi", o.size)
	}
	kc, ns, err := o.kubeFlags.client()
	if err != nil {
		return err
	}
	v, err := vmlaunch.CreateVolume(cmd.Context(), kc, ns, name, size, o.storageClass)
	if err != nil {
		return err
	}
	if v.Note != "" {
		fmt.Fprintln(cmd.ErrOrStderr(), "note:", v.Note)
	}
	st := v.Storage
	return printText(cmd.OutOrStdout(), "volume %s/%s created (%s, %s %s)\n", ns, name, size.String(), st.AccessMode, st.VolumeMode)
}

type volumeListOptions struct {
	*globalOptions
	kubeFlags
	out outputFlags
}

func newVolumeListCmd(g *globalOptions) *cobra.Command {
	o := &volumeListOptions{globalOptions: g}
	cmd := &cobra.Command{
		Use:               "list",
		Short:             "List data volumes",
		Args:              cobra.NoArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE:              func(cmd *cobra.Command, _ []string) error { return runVolumeList(cmd, o) },
	}
	addKubeFlags(cmd, &o.kubeFlags)
	addOutputFlag(cmd, &o.out, outputTable, outputJSON, outputYAML)
	return cmd
}

func runVolumeList(cmd *cobra.Command, o *volumeListOptions) error {
	if err := o.out.validate(); err != nil {
		return err
	}
	kc, ns, err := o.kubeFlags.client()
	if err != nil {
		return err
	}
	vols, err := vmlaunch.Volumes(cmd.Context(), kc, ns)
	if err != nil {
		return err
	}
	return o.out.print(cmd.OutOrStdout(), vols, table(func(tw *tabwriter.Writer) {
		fmt.Fprintln(tw, "NAME\tSIZE\tACCESS\tPHASE")
		for _, v := range vols {
			fmt.Fprintf(tw, "%s\t%s\t%v\t%s\n", v.Name, orDash(v.Size), v.AccessModes, orDash(v.Phase))
		}
	}))
}

type volumeDeleteOptions struct {
	*globalOptions
	kubeFlags
	force bool
}

func newVolumeDeleteCmd(g *globalOptions) *cobra.Command {
	o := &volumeDeleteOptions{globalOptions: g}
	cmd := &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a data volume and its data; refused while a VM uses it",
		Long: `Deletes a data volume made by imagectl volume create, and the claim holding
its data. Other DataVolumes (a VM's root disk, image-syncer's imports) are
refused.

A volume a VM still lists is refused, naming the VMs: detach it first
(imagectl vm detach-volume VM VOLUME). kubectl would accept the deletion and
leave the claim Terminating while a running VM holds it, and a stopped VM
could then not start; --force deletes it anyway, with those consequences.`,
		Example: `  imagectl vm detach-volume web data1
  imagectl volume delete data1`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeArgs(&o.kubeFlags, listVolumes),
		RunE:              func(cmd *cobra.Command, args []string) error { return runVolumeDelete(cmd, o, args[0]) },
	}
	cmd.Flags().BoolVar(&o.force, "force", false, "delete the volume even though VMs use it (they cannot start until it is detached)")
	addKubeFlags(cmd, &o.kubeFlags)
	return cmd
}

func runVolumeDelete(cmd *cobra.Command, o *volumeDeleteOptions, name string) error {
	kc, ns, err := o.kubeFlags.client()
	if err != nil {
		return err
	}
	users, err := vmlaunch.DeleteVolume(cmd.Context(), kc, ns, name, vmlaunch.DeleteVolumeOptions{Force: o.force})
	var inUse *vmlaunch.VolumeInUseError
	if errors.As(err, &inUse) {
		return fmt.Errorf("%w; detach it first (imagectl vm detach-volume %s %s), or delete it anyway with --force", err, inUse.VMs[0], name)
	}
	if err != nil {
		return err
	}
	if len(users) > 0 {
		fmt.Fprintf(cmd.ErrOrStderr(), "warning: VM %s still lists volume %s: it cannot start until the volume is detached (imagectl vm detach-volume), and a running one keeps the disk until it stops\n", strings.Join(users, ", "), name)
	}
	return printText(cmd.OutOrStdout(), "volume %s/%s deleted\n", ns, name)
}
