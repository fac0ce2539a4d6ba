package main

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/imagepipe/imagepipe/internal/cdi"
	"github.com/imagepipe/imagepipe/internal/vmlaunch"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// maxSSHKeyFile bounds an --ssh-key file.
const maxSSHKeyFile = 64 << 10

func newVMCmd(g *globalOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "vm",
		Short: "Create and run KubeVirt VMs from synced base images and provider templates",
		Long: `VMs boot from a clone of a base image image-syncer synced into the tenant's
namespace, shaped by a template from the provider's catalog. They are
live-migratable by default: ReadWriteMany disks, LiveMigrate eviction.`,
	}
	groupCommand(cmd)
	cmd.AddCommand(newVMCreateCmd(g), newVMListCmd(g), newVMGetCmd(g),
		newVMRunCmd(g, "start", "Start a VM (run strategy Always)", kubevirtv1.RunStrategyAlways),
		newVMRunCmd(g, "stop", "Stop a VM (run strategy Halted)", kubevirtv1.RunStrategyHalted),
		newVMRestartCmd(g), newVMDeleteCmd(g), newVMMigrateCmd(g),
		newVMVolumeCmd(g, true), newVMVolumeCmd(g, false))
	return cmd
}

type vmCreateOptions struct {
	*globalOptions
	kubeFlags
	catalogFlags
	image, template, templateFile string
	sets, sshKeys                 []string
	userData, storageClass        string
	stopped, dryRun               bool
	output                        string
}

func newVMCreateCmd(g *globalOptions) *cobra.Command {
	o := &vmCreateOptions{globalOptions: g}
	cmd := &cobra.Command{
		Use:   "create NAME --image TENANT/IMAGE[:TAG] --template ID [--set NAME=VALUE...]",
		Short: "Create a VM from a synced image and a template",
		Long: `Renders the template with the parameters given (--set, validated by type and
bounds) into a KubeVirt VirtualMachine whose root disk clones the image's
DataSource, checks whether it can live-migrate (and says why not), and creates
it with its cloud-init Secrets. With --dry-run it prints what it would create.`,
		Example: `  imagectl vm create web --image acme/rhel:9 --template simple_vm --set vm_cpu_cores=4 \
      --ssh-key ~/.ssh/id_ed25519.pub --catalog registry.example.com
  imagectl vm create web --image acme/rhel:9 --template-file simple_vm.yaml --dry-run -o yaml`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return runVMCreate(cmd, o, args[0]) },
	}
	f := cmd.Flags()
	f.StringVar(&o.image, "image", "", "synced image TENANT/IMAGE[:TAG] (tag default latest)")
	f.StringVar(&o.template, "template", "", "template ID in the catalog")
	f.StringVar(&o.templateFile, "template-file", "", "template file instead of the catalog")
	f.StringArrayVar(&o.sets, "set", nil, "template parameter NAME=VALUE (repeatable)")
	f.StringArrayVar(&o.sshKeys, "ssh-key", nil, "SSH public key file to authorize (repeatable)")
	f.StringVar(&o.userData, "user-data", "", "cloud-init user data file (replaces the template's)")
	f.StringVar(&o.storageClass, "storage-class", "", "StorageClass of the root disk (default: the cluster's default)")
	f.BoolVar(&o.stopped, "stopped", false, "create the VM stopped (run strategy Halted)")
	f.BoolVar(&o.dryRun, "dry-run", false, "print the VM and Secrets instead of creating them")
	f.StringVarP(&o.output, "output", "o", "", "with --dry-run: yaml or json; otherwise table, yaml or json")
	addKubeFlags(cmd, &o.kubeFlags)
	addCatalogFlags(cmd, &o.catalogFlags)
	return cmd
}

func runVMCreate(cmd *cobra.Command, o *vmCreateOptions, name string) error {
	defaultOut := "table"
	if o.dryRun {
		defaultOut = "yaml"
	}
	if o.output == "" {
		o.output = defaultOut
	}
	format, err := parseOutput(o.output, outputTable, outputJSON, outputYAML)
	if err != nil {
		return err
	}
	if o.image == "" {
		return errors.New("name the image with --image TENANT/IMAGE[:TAG]")
	}
	if (o.template == "") == (o.templateFile == "") {
		return errors.New("name one template: --template ID (from the catalog) or --template-file FILE")
	}
	var tmpl *api.VMTemplate
	if o.templateFile != "" {
		data, err := readBounded(o.templateFile, api.MaxTemplateSize)
		if err != nil {
			return fmt.Errorf("--template-file: %w", err)
		}
		if tmpl, err = vmlaunch.ParseTemplate(data); err != nil {
			return fmt.Errorf("%s: %w", o.templateFile, err)
		}
	} else {
		client, repo, err := o.catalogFlags.open(o.globalOptions)
		if err != nil {
			return err
		}
		if tmpl, err = fetchTemplate(cmd, client, repo, o.template); err != nil {
			return err
		}
	}
	values, err := vmlaunch.ResolveParameters(tmpl, o.sets)
	if err != nil {
		return fmt.Errorf("template %s:\n%w", tmpl.ID, err)
	}
	req := vmlaunch.Request{Name: name, Template: tmpl, Values: values, Stopped: o.stopped}
	for _, f := range o.sshKeys {
		data, err := readBounded(f, maxSSHKeyFile)
		if err != nil {
			return fmt.Errorf("--ssh-key %s: %w", f, err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
				if !strings.HasPrefix(line, "ssh-") && !strings.HasPrefix(line, "ecdsa-") && !strings.HasPrefix(line, "sk-") {
					return fmt.Errorf("--ssh-key %s: %q is not an SSH public key (is it the private key?)", f, line[:min(len(line), 20)])
				}
				req.SSHKeys = append(req.SSHKeys, line)
			}
		}
	}
	if o.userData != "" {
		data, err := readBounded(o.userData, vmlaunch.MaxUserData)
		if err != nil {
			return fmt.Errorf("--user-data: %w", err)
		}
		req.UserData = string(data)
	}

	ctx := cmd.Context()
	kc, ns, err := o.kubeFlags.client()
	if err != nil {
		return err
	}
	req.Namespace = ns
	if req.Image, err = vmlaunch.FindImage(ctx, kc, ns, o.image); err != nil {
		return err
	}
	st, _, note, err := cdi.StorageForClass(ctx, kc, o.storageClass)
	if err != nil {
		return fmt.Errorf("choosing the root disk's storage: %w", err)
	}
	req.Storage, req.StorageNote = st, note
	if req.Network, err = vmlaunch.PrimaryNetworkOf(ctx, kc, ns); err != nil {
		return err
	}
	r, err := vmlaunch.Render(req)
	if err != nil {
		return fmt.Errorf("template %s: %w", tmpl.ID, err)
	}
	stderr := cmd.ErrOrStderr()
	for _, n := range r.Notes {
		fmt.Fprintln(stderr, "note:", n)
	}
	if r.LiveMigratable {
		fmt.Fprintf(stderr, "VM %s will be live-migratable (%s %s disk, LiveMigrate eviction)\n", name, st.AccessMode, st.VolumeMode)
	} else {
		fmt.Fprintf(stderr, "VM %s will NOT be live-migratable; draining its node stops it:\n", name)
		for _, reason := range r.Reasons {
			fmt.Fprintln(stderr, "  -", reason)
		}
	}
	if o.dryRun {
		return printRendered(cmd.OutOrStdout(), format, r)
	}
	if err := vmlaunch.Create(ctx, kc, r); err != nil {
		return err
	}
	if format != outputTable {
		return format.print(cmd.OutOrStdout(), r.VM, nil)
	}
	fmt.Fprintf(cmd.OutOrStdout(), "virtualmachine %s/%s created from %s:%s (%s) with template %s\n", ns, name, req.Image.Tenant+"/"+req.Image.Name, req.Image.Tag, shortDigest(req.Image.Digest), tmpl.ID)
	return nil
}

// printRendered prints the VM and its Secrets as one List, as kubectl
// would take it.
func printRendered(w io.Writer, format outputFormat, r *vmlaunch.Rendered) error {
	items := []any{r.VM}
	for _, s := range r.Secrets {
		items = append(items, s)
	}
	if format == outputTable {
		format = outputYAML
	}
	return format.print(w, map[string]any{"apiVersion": "v1", "kind": "List", "items": items}, nil)
}

type vmNameOptions struct {
	*globalOptions
	kubeFlags
	output string
}

func newVMListCmd(g *globalOptions) *cobra.Command {
	o := &vmNameOptions{globalOptions: g}
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List VMs: state, IP, node, image and whether they can live-migrate",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return runVMSummaries(cmd, o, "") },
	}
	addKubeFlags(cmd, &o.kubeFlags)
	cmd.Flags().StringVarP(&o.output, "output", "o", "table", "output format: table, json or yaml")
	return cmd
}

func newVMGetCmd(g *globalOptions) *cobra.Command {
	o := &vmNameOptions{globalOptions: g}
	cmd := &cobra.Command{
		Use:   "get NAME",
		Short: "Show one VM",
		Args:  cobra.ExactArgs(1),
		RunE:  func(cmd *cobra.Command, args []string) error { return runVMSummaries(cmd, o, args[0]) },
	}
	addKubeFlags(cmd, &o.kubeFlags)
	cmd.Flags().StringVarP(&o.output, "output", "o", "table", "output format: table, json or yaml")
	return cmd
}

func runVMSummaries(cmd *cobra.Command, o *vmNameOptions, name string) error {
	format, err := parseOutput(o.output, outputTable, outputJSON, outputYAML)
	if err != nil {
		return err
	}
	kc, ns, err := o.kubeFlags.client()
	if err != nil {
		return err
	}
	vms, err := vmlaunch.Summaries(cmd.Context(), kc, ns, name)
	if err != nil {
		return err
	}
	var v any = vms
	if name != "" {
		v = vms[0]
	}
	return format.print(cmd.OutOrStdout(), v, func(tw *tabwriter.Writer) {
		fmt.Fprintln(tw, "NAME\tSTATUS\tIMAGE\tDIGEST\tTEMPLATE\tIP\tNODE\tLIVE-MIGRATABLE")
		for _, s := range vms {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Name, s.Status, orDash(s.Image), orDash(shortDigest(s.Digest)),
				orDash(s.Template), orDash(s.IP), orDash(s.Node), s.LiveMigratable)
		}
	})
}

func newVMRunCmd(g *globalOptions, verb, short string, rs kubevirtv1.VirtualMachineRunStrategy) *cobra.Command {
	o := &vmNameOptions{globalOptions: g}
	cmd := &cobra.Command{
		Use:   verb + " NAME",
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			kc, ns, err := o.kubeFlags.client()
			if err != nil {
				return err
			}
			changed, err := vmlaunch.SetRunStrategy(cmd.Context(), kc, ns, args[0], rs)
			if err != nil {
				return err
			}
			state := map[bool]string{true: "set to " + string(rs), false: "already " + string(rs)}[changed]
			fmt.Fprintf(cmd.OutOrStdout(), "virtualmachine %s/%s %s\n", ns, args[0], state)
			return nil
		},
	}
	addKubeFlags(cmd, &o.kubeFlags)
	return cmd
}

func newVMRestartCmd(g *globalOptions) *cobra.Command {
	o := &vmNameOptions{globalOptions: g}
	cmd := &cobra.Command{
		Use:   "restart NAME",
		Short: "Restart a running VM (its instance is replaced)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			kc, ns, err := o.kubeFlags.client()
			if err != nil {
				return err
			}
			if err := vmlaunch.Restart(cmd.Context(), kc, ns, args[0]); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "virtualmachine %s/%s restarting\n", ns, args[0])
			return nil
		},
	}
	addKubeFlags(cmd, &o.kubeFlags)
	return cmd
}

func newVMDeleteCmd(g *globalOptions) *cobra.Command {
	o := &vmNameOptions{globalOptions: g}
	cmd := &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a VM and its root disk; attached data volumes stay",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			kc, ns, err := o.kubeFlags.client()
			if err != nil {
				return err
			}
			s, err := vmlaunch.Summaries(cmd.Context(), kc, ns, args[0])
			if err != nil {
				return err
			}
			if err := vmlaunch.Delete(cmd.Context(), kc, ns, args[0]); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "virtualmachine %s/%s deleted\n", ns, args[0])
			if v := s[0].Volumes; len(v) > 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "data volumes kept: %s\n", strings.Join(v, ", "))
			}
			return nil
		},
	}
	addKubeFlags(cmd, &o.kubeFlags)
	return cmd
}

func newVMMigrateCmd(g *globalOptions) *cobra.Command {
	o := &vmNameOptions{globalOptions: g}
	cmd := &cobra.Command{
		Use:   "migrate NAME",
		Short: "Live-migrate a running VM to another node",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			kc, ns, err := o.kubeFlags.client()
			if err != nil {
				return err
			}
			m, err := vmlaunch.Migrate(cmd.Context(), kc, ns, args[0])
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "virtualmachineinstancemigration %s/%s created\n", ns, m.Name)
			return nil
		},
	}
	addKubeFlags(cmd, &o.kubeFlags)
	return cmd
}

func newVMVolumeCmd(g *globalOptions, attach bool) *cobra.Command {
	o := &vmNameOptions{globalOptions: g}
	use, short := "attach-volume VM VOLUME", "Attach a data volume to a VM (applied at its next start when it runs)"
	if !attach {
		use, short = "detach-volume VM VOLUME", "Detach a data volume from a VM; the volume stays"
	}
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			kc, ns, err := o.kubeFlags.client()
			if err != nil {
				return err
			}
			do, verb := vmlaunch.DetachVolume, "detached from"
			if attach {
				do, verb = vmlaunch.AttachVolume, "attached to"
			}
			changed, err := do(cmd.Context(), kc, ns, args[0], args[1])
			if err != nil {
				return err
			}
			if !changed {
				fmt.Fprintf(cmd.OutOrStdout(), "volume %s: nothing to do\n", args[1])
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "volume %s %s virtualmachine %s/%s", args[1], verb, ns, args[0])
			s, err := vmlaunch.Summaries(cmd.Context(), kc, ns, args[0])
			if err == nil && s[0].Status != "Stopped" && s[0].Status != "Unknown" {
				fmt.Fprint(cmd.OutOrStdout(), "; it takes effect when the VM next starts (imagectl vm restart)")
			}
			fmt.Fprintln(cmd.OutOrStdout())
			return nil
		},
	}
	addKubeFlags(cmd, &o.kubeFlags)
	return cmd
}
