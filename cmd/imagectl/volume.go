package main

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/imagepipe/imagepipe/internal/vmlaunch"
	"github.com/imagepipe/imagepipe/pkg/api"
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
	out                outputFlags
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
	addOutputFlag(cmd, &o.out, resultFormats...)
	return cmd
}

// volumeName is a data volume's name as -o name prints it, as kubectl's
// would.
func volumeName(name string) string { return "datavolume/" + name }

func runVolumeCreate(cmd *cobra.Command, o *volumeCreateOptions, name string) error {
	if err := o.out.validate(); err != nil {
		return err
	}
	size, err := resource.ParseQuantity(o.size)
	if err != nil {
		return &usageError{fmt.Errorf("--size %q: want a quantity such as 50Gi", o.size)}
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
	return o.out.show(cmd.OutOrStdout(), view{data: vmlaunch.VolumeSummary(v.DataVolume), names: []string{volumeName(name)}, table: func(w io.Writer, _ bool) error {
		_, err := fmt.Fprintf(w, "volume %s/%s created (%s, %s %s)\n", ns, name, size.String(), st.AccessMode, st.VolumeMode)
		return err
	}})
}

type volumeListOptions struct {
	*globalOptions
	kubeFlags
	out outputFlags
}

func newVolumeListCmd(g *globalOptions) *cobra.Command {
	o := &volumeListOptions{globalOptions: g}
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List data volumes",
		Long: `Lists the data volumes imagectl volume create made in the namespace. -o wide
adds their volume mode and StorageClass; -o name prints datavolume/NAME, one
a line.`,
		Args:              cobra.NoArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE:              func(cmd *cobra.Command, _ []string) error { return runVolumeList(cmd, o) },
	}
	addKubeFlags(cmd, &o.kubeFlags)
	addOutputFlag(cmd, &o.out, listFormats...)
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
	names := make([]string, len(vols))
	for i, v := range vols {
		names[i] = volumeName(v.Name)
	}
	return o.out.show(cmd.OutOrStdout(), view{data: vols, names: names, table: func(w io.Writer, wide bool) error {
		return table(func(tw *tabwriter.Writer) {
			if wide {
				fmt.Fprintln(tw, "NAME\tSIZE\tACCESS\tPHASE\tVOLUME MODE\tSTORAGE CLASS")
			} else {
				fmt.Fprintln(tw, "NAME\tSIZE\tACCESS\tPHASE")
			}
			for _, v := range vols {
				fmt.Fprintf(tw, "%s\t%s\t%v\t%s", v.Name, orDash(v.Size), v.AccessModes, orDash(v.Phase))
				if wide {
					fmt.Fprintf(tw, "\t%s\t%s", orDash(v.VolumeMode), orDash(v.StorageClass))
				}
				fmt.Fprintln(tw)
			}
		})(w)
	}})
}

type volumeDeleteOptions struct {
	*globalOptions
	kubeFlags
	force bool
	out   outputFlags
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
	addOutputFlag(cmd, &o.out, resultFormats...)
	return cmd
}

func runVolumeDelete(cmd *cobra.Command, o *volumeDeleteOptions, name string) error {
	if err := o.out.validate(); err != nil {
		return err
	}
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
	res := api.VolumeDeleteResult{Name: name, Namespace: ns, AttachedTo: users}
	return o.out.show(cmd.OutOrStdout(), view{data: res, names: []string{volumeName(name)}, table: func(w io.Writer, _ bool) error {
		_, err := fmt.Fprintf(w, "volume %s/%s deleted\n", ns, name)
		return err
	}})
}
