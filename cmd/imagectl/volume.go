package main

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/resource"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"

	"github.com/imagepipe/imagepipe/internal/cdi"
	"github.com/imagepipe/imagepipe/internal/vmlaunch"
)

func newVolumeCmd(g *globalOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "volume",
		Short: "Data volumes whose life is independent of any VM",
	}
	groupCommand(cmd)
	cmd.AddCommand(newVolumeCreateCmd(g), newVolumeListCmd(g))
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
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			size, err := resource.ParseQuantity(o.size)
			if err != nil {
				return fmt.Errorf("--size %q: want a quantity such as 50Gi", o.size)
			}
			kc, ns, err := o.kubeFlags.client()
			if err != nil {
				return err
			}
			st, _, note, err := cdi.StorageForClass(cmd.Context(), kc, o.storageClass)
			if err != nil {
				return fmt.Errorf("choosing the volume's storage: %w", err)
			}
			if note != "" {
				fmt.Fprintln(cmd.ErrOrStderr(), "note:", note)
			}
			if _, err := vmlaunch.CreateVolume(cmd.Context(), kc, ns, args[0], size, st); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "volume %s/%s created (%s, %s %s)\n", ns, args[0], size.String(), st.AccessMode, st.VolumeMode)
			return nil
		},
	}
	cmd.Flags().StringVar(&o.size, "size", "", "size, e.g. 50Gi (required)")
	cmd.Flags().StringVar(&o.storageClass, "storage-class", "", "StorageClass (default: the cluster's default)")
	_ = cmd.MarkFlagRequired("size")
	addKubeFlags(cmd, &o.kubeFlags)
	return cmd
}

func newVolumeListCmd(g *globalOptions) *cobra.Command {
	o := &vmNameOptions{globalOptions: g}
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List data volumes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			kc, ns, err := o.kubeFlags.client()
			if err != nil {
				return err
			}
			var list cdiv1.DataVolumeList
			if err := kc.List(cmd.Context(), ns, vmlaunch.LabelVolume, &list); err != nil {
				return fmt.Errorf("listing volumes: %w", err)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tSIZE\tACCESS\tPHASE")
			for _, dv := range list.Items {
				size := dv.Spec.Storage.Resources.Requests.Storage()
				fmt.Fprintf(tw, "%s\t%s\t%v\t%s\n", dv.Name, size.String(), dv.Spec.Storage.AccessModes, orDash(string(dv.Status.Phase)))
			}
			return tw.Flush()
		},
	}
	addKubeFlags(cmd, &o.kubeFlags)
	return cmd
}
