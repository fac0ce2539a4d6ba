package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/util/duration"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/imagepipe/imagepipe/internal/kube"
	"github.com/imagepipe/imagepipe/internal/tenantnet"
	"github.com/imagepipe/imagepipe/internal/vmlaunch"
	"github.com/imagepipe/imagepipe/pkg/api"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
)

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
		newVMRestartCmd(g), newVMDeleteCmd(g), newVMMigrateCmd(g), newVMUpdateCmd(g),
		newVMVolumeCmd(g, true), newVMVolumeCmd(g, false),
		newVMExposeCmd(g), newVMUnexposeCmd(g), newVMConsoleCmd(g))
	return cmd
}

type vmCreateOptions struct {
	*globalOptions
	kubeFlags
	catalogFlags
	image, template, templateFile string
	sets, sshKeys, localnets      []string
	userData, storageClass        string
	network, ip                   string
	stopped, dryRun, wait         bool
	timeout                       time.Duration
	timeoutSet                    bool // --timeout was given
	out                           outputFlags
}

// defaultWaitTimeout is vm create --timeout's default.
const defaultWaitTimeout = 5 * time.Minute

func newVMCreateCmd(g *globalOptions) *cobra.Command {
	o := &vmCreateOptions{globalOptions: g}
	cmd := &cobra.Command{
		Use:   "create NAME --image TENANT/IMAGE[:TAG] --template ID [--set NAME=VALUE...]",
		Short: "Create a VM from a synced image and a template",
		Long: `Renders the template with the parameters given (--set, validated by type and
bounds) into a KubeVirt VirtualMachine whose root disk clones the image's
DataSource, checks whether it can live-migrate (and says why not), and creates
it with its cloud-init Secrets. With --dry-run it prints what it would create.

The VM boots the disk as the gate found it (the image's DataSource says):
with EFI, Secure Boot off, when the disk boots only with UEFI, with BIOS
when it boots only with BIOS, and with its disks on SATA when the guest
has no virtio block drivers, unless the template sets firmware or diskBus.
A template whose firmware the disk cannot boot with is refused. Unknown
facts change nothing.

With --wait it then waits until KubeVirt reports the VM Ready (or its instance
Running); a VM created --stopped, until KubeVirt reports it Stopped, its disk
provisioned. When --timeout passes first it fails, naming what it waited for
and the VM's last status and conditions; the VM stays.`,
		Example: `  imagectl vm create web --image acme/rhel:9 --template simple_vm --set vm_cpu_cores=4 \
      --ssh-key ~/.ssh/id_ed25519.pub --catalog registry.example.com --wait
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
	f.StringVar(&o.network, "network", "", "private network to put the VM on (imagectl network): the VM is created in the network's namespace")
	f.StringVar(&o.ip, "ip", "", "with --network: the VM's address on the network, which it keeps (OVN-Kubernetes' static IP request); default: one the network assigns")
	f.StringArrayVar(&o.localnets, "localnet", nil, "provider localnet to attach a second interface to (repeatable): a ClusterUserDefinedNetwork of topology Localnet that selects the namespace")
	f.BoolVar(&o.stopped, "stopped", false, "create the VM stopped (run strategy Halted)")
	f.BoolVar(&o.dryRun, "dry-run", false, "print the VM and Secrets instead of creating them")
	f.BoolVar(&o.wait, "wait", false, "wait until the VM is Ready (Stopped with --stopped), then print its state")
	f.DurationVar(&o.timeout, "timeout", defaultWaitTimeout, "with --wait: how long to wait, e.g. 90s, 10m")
	addOutputFlag(cmd, &o.out, resultFormats...)
	f.Lookup("output").DefValue, o.out.format = "", ""
	f.Lookup("output").Usage = "output format: table (the default), json, yaml or name; with --dry-run yaml (the default), json or name"
	o.out.defaultFor = func() outputFormat {
		if o.dryRun {
			return outputYAML
		}
		return outputTable
	}
	addKubeFlags(cmd, &o.kubeFlags)
	addCatalogFlags(cmd, &o.catalogFlags)
	cmd.ValidArgsFunction = cobra.NoFileCompletions // a new name
	_ = cmd.RegisterFlagCompletionFunc("image", completeFlagFromHub(&o.kubeFlags, listImages))
	_ = cmd.RegisterFlagCompletionFunc("template", completeTemplateIDs(o.globalOptions, &o.catalogFlags))
	return cmd
}

func runVMCreate(cmd *cobra.Command, o *vmCreateOptions, name string) error {
	o.timeoutSet = cmd.Flags().Changed("timeout")
	if err := o.validate(); err != nil {
		return err
	}
	tmpl, err := o.loadTemplate(cmd)
	if err != nil {
		return err
	}
	req, err := o.request(name, tmpl)
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	kc, ns, err := o.kubeFlags.client()
	if err != nil {
		return err
	}
	if o.network != "" {
		home := ns
		if req.ImageNamespace, ns, err = networkNamespace(ctx, kc, ns, o.network); err != nil {
			return err
		}
		if o.ip != "" {
			if req.IP, err = requestedAddress(ctx, kc, home, ns, o.network, o.ip); err != nil {
				return err
			}
		}
	} else if o.ip != "" {
		return &usageError{errors.New("--ip needs --network: a VM chooses its address only on a private network, which keeps it")}
	}
	r, err := vmlaunch.Prepare(ctx, kc, ns, o.image, o.storageClass, req)
	if err != nil {
		return err
	}
	vmlaunch.Record(r, o.image, setMap(o.sets))
	reportMigratability(cmd.ErrOrStderr(), name, r)
	if o.dryRun {
		return printRendered(cmd.OutOrStdout(), &o.out, r)
	}
	if err := vmlaunch.Create(ctx, kc, r); err != nil {
		return err
	}
	created := func(w io.Writer, _ bool) error {
		im := r.Image
		_, err := fmt.Fprintf(w, "virtualmachine %s/%s created from %s:%s (%s) with template %s\n", ns, name, im.Tenant+"/"+im.Name, im.Tag, shortDigest(im.Digest), tmpl.ID)
		return err
	}
	names := []string{vmName(name)}
	if !o.wait {
		return o.out.show(cmd.OutOrStdout(), view{data: r.VM, names: names, table: created})
	}
	if o.out.format == outputTable {
		if err := created(cmd.OutOrStdout(), false); err != nil {
			return err
		}
	}
	state, err := waitForVM(cmd, kc, r.VM, o.timeout)
	if err != nil {
		return err
	}
	return o.out.show(cmd.OutOrStdout(), view{data: state.VM, names: names, table: func(w io.Writer, _ bool) error {
		return printVMState(w, state)
	}})
}

// vmName is a VM's name as -o name prints it, as kubectl's would.
func vmName(name string) string { return "virtualmachine/" + name }

// waitForVM waits up to timeout for the VM just created to be where
// vmlaunch.WaitGoal says, telling its status changes on standard error.
// On timeout the error says that the VM stays, and how to look at it or
// remove it.
func waitForVM(cmd *cobra.Command, kc vmlaunch.Cluster, vm *kubevirtv1.VirtualMachine, timeout time.Duration) (*vmlaunch.VMState, error) {
	stderr := cmd.ErrOrStderr()
	fmt.Fprintf(stderr, "waiting up to %s for VM %s/%s to be %s\n", timeout, vm.Namespace, vm.Name, vmlaunch.WaitGoal(vm))
	ctx, cancel := context.WithTimeoutCause(cmd.Context(), timeout, fmt.Errorf("timed out after %s", timeout))
	defer cancel()
	state, err := vmlaunch.WaitReady(ctx, kc, vm.Namespace, vm.Name, vmlaunch.WaitOptions{
		Progress: func(status string) { fmt.Fprintf(stderr, "VM %s: %s\n", vm.Name, status) },
	})
	var werr *vmlaunch.WaitError
	if errors.As(err, &werr) {
		return nil, fmt.Errorf("%w\nthe VM was created and stays: imagectl vm get %s -n %s shows its state, imagectl vm delete %s -n %s removes it",
			err, vm.Name, vm.Namespace, vm.Name, vm.Namespace)
	}
	return state, err
}

// printVMState prints the line vm create --wait ends with.
func printVMState(w io.Writer, s *vmlaunch.VMState) error {
	vm := s.VM
	status := string(vm.Status.PrintableStatus)
	if s.Instance != nil && s.Instance.Status.Phase == kubevirtv1.Running {
		status = string(kubevirtv1.Running)
	}
	line := fmt.Sprintf("virtualmachine %s/%s is %s", vm.Namespace, vm.Name, orDash(status))
	if vmi := s.Instance; vmi != nil {
		if vmi.Status.NodeName != "" {
			line += " on node " + vmi.Status.NodeName
		}
		if len(vmi.Status.Interfaces) > 0 && vmi.Status.Interfaces[0].IP != "" {
			line += ", IP " + vmi.Status.Interfaces[0].IP
		}
	}
	if vm.Status.PrintableStatus == kubevirtv1.VirtualMachineStatusStopped {
		line += "; imagectl vm start " + vm.Name + " starts it"
	}
	_, err := fmt.Fprintln(w, line)
	return err
}

// validate checks the flags before anything is read.
func (o *vmCreateOptions) validate() error {
	if err := o.out.validate(); err != nil {
		return err
	}
	if o.image == "" {
		return &usageError{errors.New("name the image with --image TENANT/IMAGE[:TAG]")}
	}
	if (o.template == "") == (o.templateFile == "") {
		return &usageError{errors.New("name one template: --template ID (from the catalog) or --template-file FILE")}
	}
	if o.wait && o.dryRun {
		return &usageError{errors.New("--wait has nothing to wait for with --dry-run, which creates nothing")}
	}
	return checkWait(o.wait, o.timeout, o.timeoutSet)
}

// loadTemplate reads the template from --template-file or the catalog.
func (o *vmCreateOptions) loadTemplate(cmd *cobra.Command) (*api.VMTemplate, error) {
	if o.templateFile != "" {
		data, err := readBounded(o.templateFile, api.MaxTemplateSize)
		if err != nil {
			return nil, fmt.Errorf("--template-file: %w", err)
		}
		tmpl, err := vmlaunch.ParseTemplate(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", o.templateFile, err)
		}
		return tmpl, nil
	}
	cat, err := o.catalogFlags.open(o.globalOptions)
	if err != nil {
		return nil, err
	}
	return fetchTemplate(cmd, cat, o.template)
}

// request gathers what the tenant gives the template: parameters, SSH keys
// and user data, each checked.
func (o *vmCreateOptions) request(name string, tmpl *api.VMTemplate) (vmlaunch.Request, error) {
	values, err := vmlaunch.ResolveParameters(tmpl, o.sets)
	if err != nil {
		return vmlaunch.Request{}, fmt.Errorf("template %s:\n%w", tmpl.ID, err)
	}
	req := vmlaunch.Request{Name: name, Template: tmpl, Values: values, Stopped: o.stopped, Localnets: o.localnets}
	for _, f := range o.sshKeys {
		data, err := readBounded(f, vmlaunch.MaxSSHKeyFile)
		if err != nil {
			return req, fmt.Errorf("--ssh-key %s: %w", f, err)
		}
		keys, err := vmlaunch.ParseSSHKeys(data)
		if err != nil {
			return req, fmt.Errorf("--ssh-key %s: %w", f, err)
		}
		req.SSHKeys = append(req.SSHKeys, keys...)
	}
	if o.userData != "" {
		data, err := readBounded(o.userData, vmlaunch.MaxUserData)
		if err != nil {
			return req, fmt.Errorf("--user-data: %w", err)
		}
		req.UserData = string(data)
	}
	return req, nil
}

// setMap reads --set NAME=VALUE flags, the last of a name winning; the
// template's own checks refuse what does not parse.
func setMap(sets []string) map[string]string {
	m := map[string]string{}
	for _, kv := range sets {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return m
}

func newVMUpdateCmd(g *globalOptions) *cobra.Command {
	o := &vmCreateOptions{globalOptions: g}
	cmd := &cobra.Command{
		Use:   "update NAME [--set NAME=VALUE...]",
		Short: "Apply a VM's template again with changed parameters",
		Long: `Renders the VM's template again, with the parameters it was created with and
those --set changes, and applies what a template decides of a VM's compute:
instancetype, preference, CPU, memory and resources, GPUs and host devices.
It says for each change when it applies: live (the cluster's KubeVirt rolls
changes out to running VMs, vmRolloutStrategy LiveUpdate: memory and the
instancetype), at the next restart (imagectl vm restart), or when a stopped
VM starts.

The VM's root disk, networks and cloud-init data are its own: a change of
the root disk's size is refused (create a new VM), and networks and user
data are not re-applied. The template is the one the VM was made from, from
the catalog, unless --template or --template-file names another.`,
		Example: `  imagectl vm update web --set vm_memory=8Gi --catalog registry.example.com
  imagectl vm update web --set vm_cpu_cores=4 --template-file simple_vm.yaml --network front`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeArgs(&o.kubeFlags, listVMs),
		RunE:              func(cmd *cobra.Command, args []string) error { return runVMUpdate(cmd, o, args[0]) },
	}
	f := cmd.Flags()
	f.StringVar(&o.template, "template", "", "template ID in the catalog (default: the VM's)")
	f.StringVar(&o.templateFile, "template-file", "", "template file instead of the catalog")
	f.StringArrayVar(&o.sets, "set", nil, "template parameter NAME=VALUE to change (repeatable)")
	addNetworkFlag(cmd, &o.network)
	addKubeFlags(cmd, &o.kubeFlags)
	addCatalogFlags(cmd, &o.catalogFlags)
	addOutputFlag(cmd, &o.out, resultFormats...)
	return cmd
}

func runVMUpdate(cmd *cobra.Command, o *vmCreateOptions, name string) error {
	if err := o.out.validate(); err != nil {
		return err
	}
	if o.template != "" && o.templateFile != "" {
		return &usageError{errors.New("name at most one template: --template ID or --template-file FILE")}
	}
	ctx := cmd.Context()
	kc, ns, err := o.kubeFlags.client()
	if err != nil {
		return err
	}
	var imageNS string
	if o.network != "" {
		if imageNS, ns, err = networkNamespace(ctx, kc, ns, o.network); err != nil {
			return err
		}
	}
	var vm kubevirtv1.VirtualMachine
	if err := kc.Get(ctx, ns, name, &vm); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("no VM %s in namespace %s", name, ns)
		}
		return err
	}
	imageRef, sets, ok := vmlaunch.Recorded(&vm)
	if !ok {
		return fmt.Errorf("VM %s: %w", name, vmlaunch.ErrNotRecorded)
	}
	maps.Copy(sets, setMap(o.sets))
	o.sets = vmlaunch.SetList(sets)
	if o.template == "" && o.templateFile == "" {
		o.template = vm.Labels[vmlaunch.LabelTemplate]
	}
	tmpl, err := o.loadTemplate(cmd)
	if err != nil {
		return err
	}
	req, err := o.request(name, tmpl)
	if err != nil {
		return err
	}
	req.ImageNamespace = imageNS
	r, err := vmlaunch.Prepare(ctx, kc, ns, imageRef, "", req)
	if err != nil {
		return err
	}
	vmlaunch.Record(r, imageRef, sets)
	kv, err := vmlaunch.ReadKubeVirtConfig(ctx, kc)
	if err != nil {
		return err
	}
	changes, err := vmlaunch.Update(ctx, kc, r, kv.LiveUpdate)
	if err != nil {
		return err
	}
	text := fmt.Sprintf("virtualmachine %s/%s unchanged: the template gives what it has\n", ns, name)
	if len(changes) > 0 {
		text = fmt.Sprintf("virtualmachine %s/%s updated\n", ns, name)
	}
	when := map[string]string{api.VMChangeLive: "applied to the running VM", api.VMChangeAtRestart: "at the next restart: imagectl vm restart " + name, api.VMChangeAtStart: "when the VM starts"}
	for _, c := range changes {
		text += fmt.Sprintf("  %s: %s -> %s (%s)\n", c.Field, c.From, c.To, when[c.When])
	}
	res := api.VMResult{Name: name, Namespace: ns, Action: api.VMActionUpdate, Changed: len(changes) > 0, Changes: changes}
	return o.out.show(cmd.OutOrStdout(), view{data: res, names: []string{vmName(name)}, table: func(w io.Writer, _ bool) error {
		_, err := io.WriteString(w, text)
		return err
	}})
}

// requestedAddress checks ip, which a VM asks for on network (of the
// tenant's namespace home, its VMs in ns): in the network's subnet, none of
// its reserved addresses, and asked for by no other VM there.
func requestedAddress(ctx context.Context, kc *kube.Client, home, ns, network, ip string) (netip.Prefix, error) {
	pn, err := getNetwork(ctx, kc, home, network)
	if err != nil {
		return netip.Prefix{}, err
	}
	subnet, err := netip.ParsePrefix(pn.Spec.IPv4CIDR)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("network %s has no valid subnet: %w", network, err)
	}
	addr, err := tenantnet.CheckAddress(subnet, ip)
	if err != nil {
		return netip.Prefix{}, &usageError{err}
	}
	var vms kubevirtv1.VirtualMachineList
	if err := kc.List(ctx, ns, "", &vms); err != nil {
		return netip.Prefix{}, fmt.Errorf("listing the VMs on network %s: %w", network, err)
	}
	for _, vm := range vms.Items {
		if vm.Spec.Template == nil {
			continue
		}
		var asked map[string][]string
		if json.Unmarshal([]byte(vm.Spec.Template.ObjectMeta.Annotations[vmlaunch.AnnotationIPRequest]), &asked) != nil {
			continue
		}
		for _, as := range asked {
			for _, a := range as {
				if p, err := netip.ParsePrefix(a); err == nil && p.Addr() == addr.Addr() {
					return netip.Prefix{}, fmt.Errorf("VM %s already asks for address %s on network %s", vm.Name, addr.Addr(), network)
				}
			}
		}
	}
	return addr, nil
}

// reportMigratability tells on standard error whether the VM will
// live-migrate, and why not.
func reportMigratability(stderr io.Writer, name string, r *vmlaunch.Rendered) {
	for _, n := range r.Notes {
		fmt.Fprintln(stderr, "note:", n)
	}
	if r.LiveMigratable {
		st := r.Storage
		fmt.Fprintf(stderr, "VM %s will be live-migratable (%s %s disk, LiveMigrate eviction)\n", name, st.AccessMode, st.VolumeMode)
		return
	}
	fmt.Fprintf(stderr, "VM %s will NOT be live-migratable; draining its node stops it:\n", name)
	for _, reason := range r.Reasons {
		fmt.Fprintln(stderr, "  -", reason)
	}
}

// printRendered prints the VM and its Secrets as one List, as kubectl
// would take it (YAML unless JSON is asked for), or with -o name their
// kind/name, one a line.
func printRendered(w io.Writer, out *outputFlags, r *vmlaunch.Rendered) error {
	items := []any{r.VM}
	names := []string{vmName(r.VM.Name)}
	for _, s := range r.Secrets {
		items = append(items, s)
		names = append(names, "secret/"+s.Name)
	}
	if out.format == outputTable {
		out = &outputFlags{format: outputYAML} // a List has no table form
	}
	return out.show(w, view{data: map[string]any{"apiVersion": "v1", "kind": "List", "items": items}, names: names})
}

type vmNameOptions struct {
	*globalOptions
	kubeFlags
	out outputFlags
	// allNamespaces is vm list's -A.
	allNamespaces bool
	// network is --network: the VMs are on this private network of the
	// namespace, so in the network's namespace.
	network string
}

// addNetworkFlag adds --network, which points a vm command at the VMs of
// one of the namespace's private networks.
func addNetworkFlag(cmd *cobra.Command, network *string) {
	cmd.Flags().StringVar(network, "network", "", "the VM is on this private network of the namespace (in the network's namespace)")
}

// namespaceOf is the namespace the VMs of o are in: the network's when
// --network names one, else ns.
func (o *vmNameOptions) namespaceOf(ctx context.Context, kc *kube.Client, ns string) (string, error) {
	if o.network == "" {
		return ns, nil
	}
	_, vms, err := networkNamespace(ctx, kc, ns, o.network)
	return vms, err
}

func newVMListCmd(g *globalOptions) *cobra.Command {
	o := &vmNameOptions{globalOptions: g}
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List VMs: state, IP and external IP, node, image and whether they can live-migrate",
		Long: `Lists the VMs of the namespace and of its private networks' namespaces,
with the network each is on (NETWORK); --network NAME lists one network's
only. With -A (--all-namespaces) it lists the VMs of every namespace, as
kubectl does: a NAMESPACE column is added and -n is ignored.
Listing every namespace needs the right to list VMs cluster-wide, which a
tenant's account usually does not have.

-o wide adds the full image digest, the guest's operating system (as the
gate found it in the image), the attached data volumes and why a VM
cannot live-migrate; -o name prints virtualmachine/NAME, one a line.
Under -o json and yaml, liveMigratable is true, false, or null when
neither KubeVirt nor vm create said.`,
		Example: `  imagectl vm list -n acme
  imagectl vm list -n acme -o wide
  imagectl vm list -A -o json`,
		Args:              cobra.NoArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE:              func(cmd *cobra.Command, _ []string) error { return runVMSummaries(cmd, o, "") },
	}
	addKubeFlags(cmd, &o.kubeFlags)
	addNetworkFlag(cmd, &o.network)
	cmd.Flags().BoolVarP(&o.allNamespaces, "all-namespaces", "A", false, "list the VMs of every namespace (-n is then ignored)")
	addOutputFlag(cmd, &o.out, listFormats...)
	return cmd
}

func newVMGetCmd(g *globalOptions) *cobra.Command {
	o := &vmNameOptions{globalOptions: g}
	cmd := &cobra.Command{
		Use:   "get NAME",
		Short: "Show one VM",
		Long: `Shows one VM as vm list does (-o wide for more columns, the guest's
operating system among them); -o json and yaml print one object, not a
list.`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeArgs(&o.kubeFlags, listVMs),
		RunE:              func(cmd *cobra.Command, args []string) error { return runVMSummaries(cmd, o, args[0]) },
	}
	addKubeFlags(cmd, &o.kubeFlags)
	addNetworkFlag(cmd, &o.network)
	addOutputFlag(cmd, &o.out, listFormats...)
	return cmd
}

func runVMSummaries(cmd *cobra.Command, o *vmNameOptions, name string) error {
	if err := o.out.validate(); err != nil {
		return err
	}
	kc, ns, err := o.kubeFlags.connect(o.allNamespaces)
	if err != nil {
		return err
	}
	vms, err := o.summaries(cmd.Context(), kc, ns, name)
	if o.allNamespaces && apierrors.IsForbidden(err) {
		return fmt.Errorf("%w\nyour account may not list VMs in every namespace; drop -A and name one with -n", err)
	}
	if err != nil {
		return err
	}
	var v any = vms
	if name != "" {
		v = vms[0]
	}
	names := make([]string, len(vms))
	for i, s := range vms {
		names[i] = vmName(s.Name)
	}
	return o.out.show(cmd.OutOrStdout(), view{data: v, names: names, table: func(w io.Writer, wide bool) error {
		return table(func(tw *tabwriter.Writer) {
			if o.allNamespaces {
				fmt.Fprint(tw, "NAMESPACE\t")
			}
			fmt.Fprint(tw, "NAME\tNETWORK\tSTATUS\tIMAGE\tDIGEST\tTEMPLATE\tIP\tEXTERNAL-IP\tNODE\tLIVE-MIGRATABLE")
			if wide {
				fmt.Fprint(tw, "\tOS\tCONDITIONS\tVOLUMES\tNOT MIGRATABLE BECAUSE")
			}
			fmt.Fprintln(tw)
			for _, s := range vms {
				if o.allNamespaces {
					fmt.Fprintf(tw, "%s\t", s.Namespace)
				}
				digest := shortDigest(s.Digest)
				if wide {
					digest = s.Digest
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s", s.Name, orDash(s.Network), s.Status, orDash(s.Image), orDash(digest),
					orDash(s.Template), orDash(s.IP), orDash(strings.Join(s.ExternalIPs, ",")), orDash(s.Node), yesNoUnknown(s.LiveMigratable))
				if wide {
					reasons := ""
					if s.LiveMigratable != nil && !*s.LiveMigratable {
						reasons = strings.Join(s.Reasons, "; ")
					}
					fmt.Fprintf(tw, "\t%s\t%s\t%s\t%s", orDash(s.OS), orDash(trueConditions(s.Conditions, time.Now())), orDash(strings.Join(s.Volumes, ",")), orDash(reasons))
				}
				fmt.Fprintln(tw)
			}
		})(w)
	}})
}

// summaries are the VMs vm list and get show: with -A every namespace's;
// else those of the namespaces o.namespaces names, each with its network.
func (o *vmNameOptions) summaries(ctx context.Context, kc *kube.Client, ns, name string) ([]api.VMSummary, error) {
	if o.allNamespaces || (name != "" && o.network == "") {
		return vmlaunch.Summaries(ctx, kc, ns, name)
	}
	where, err := o.namespaces(ctx, kc, ns)
	if err != nil {
		return nil, err
	}
	out := []api.VMSummary{}
	for _, n := range slices.Sorted(maps.Keys(where)) {
		on, err := vmlaunch.Summaries(ctx, kc, n, name)
		if err != nil {
			return nil, err
		}
		for i := range on {
			on[i].Network = where[n]
		}
		out = append(out, on...)
	}
	return out, nil
}

// namespaces are where the VMs and load balancers of o are, by namespace,
// with the private network each is of ("" for ns itself): with --network
// that network's namespace; else ns and the namespaces of its networks.
func (o *vmNameOptions) namespaces(ctx context.Context, kc *kube.Client, ns string) (map[string]string, error) {
	if o.network != "" {
		vms, err := o.namespaceOf(ctx, kc, ns)
		return map[string]string{vms: o.network}, err
	}
	where := map[string]string{ns: ""}
	var nets v1alpha1.PrivateNetworkList
	if err := kc.List(ctx, ns, "", &nets); err != nil && !meta.IsNoMatchError(err) {
		return nil, fmt.Errorf("listing the networks of %s: %w", ns, err)
	}
	for _, pn := range nets.Items {
		if pn.Status.Namespace != "" {
			where[pn.Status.Namespace] = pn.Name
		}
	}
	return where, nil
}

// trueConditions lists the types of the conditions that hold, each with
// how long ago it last changed when KubeVirt says (Ready(5m)), as of now.
func trueConditions(conds []api.VMCondition, now time.Time) string {
	var on []string
	for _, c := range conds {
		if c.Status != "True" {
			continue
		}
		if at, err := time.Parse(time.RFC3339, c.LastTransitionTime); err == nil {
			on = append(on, c.Type+"("+duration.HumanDuration(now.Sub(at))+")")
		} else {
			on = append(on, c.Type)
		}
	}
	return strings.Join(on, ",")
}

// yesNoUnknown shows a verdict that may be unknown (nil) in a table.
func yesNoUnknown(b *bool) string {
	switch {
	case b == nil:
		return "unknown"
	case *b:
		return "true"
	}
	return "false"
}

// vmLifecycleCmd is a vm subcommand that acts on named objects: run gets
// the client and namespace from the kube flags and returns what it did,
// which is printed as a line for people, as api.VMResult under -o json or
// yaml, or as the object's kind/name under -o name.
// The second argument's candidates for shell completion are second's
// (nil: none); the first is always a VM name.
func vmLifecycleCmd(g *globalOptions, use, short string, nargs int, second hubLister, run func(cmd *cobra.Command, kc vmlaunch.Cluster, ns string, args []string) (*vmOutcome, error)) *cobra.Command {
	o := &vmNameOptions{globalOptions: g}
	listers := []hubLister{listVMs, second}[:nargs]
	cmd := &cobra.Command{
		Use:               use,
		Short:             short,
		Args:              cobra.ExactArgs(nargs),
		ValidArgsFunction: completeArgs(&o.kubeFlags, listers...),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.out.validate(); err != nil {
				return err
			}
			kc, ns, err := o.kubeFlags.client()
			if err != nil {
				return err
			}
			if ns, err = o.namespaceOf(cmd.Context(), kc, ns); err != nil {
				return err
			}
			done, err := run(cmd, kc, ns, args)
			if err != nil {
				return err
			}
			name := vmName(done.result.Name)
			if done.result.Migration != "" {
				name = "virtualmachineinstancemigration/" + done.result.Migration
			}
			return o.out.show(cmd.OutOrStdout(), view{data: done.result, names: []string{name}, table: func(w io.Writer, _ bool) error {
				_, err := io.WriteString(w, done.text)
				return err
			}})
		},
	}
	addKubeFlags(cmd, &o.kubeFlags)
	addNetworkFlag(cmd, &o.network)
	addOutputFlag(cmd, &o.out, resultFormats...)
	return cmd
}

// vmOutcome is what a vm lifecycle command did: its result and the text
// people read.
type vmOutcome struct {
	result api.VMResult
	text   string
}

func newVMRunCmd(g *globalOptions, verb, short string, rs kubevirtv1.VirtualMachineRunStrategy) *cobra.Command {
	return vmLifecycleCmd(g, verb+" NAME", short, 1, nil, func(cmd *cobra.Command, kc vmlaunch.Cluster, ns string, args []string) (*vmOutcome, error) {
		changed, err := vmlaunch.SetRunStrategy(cmd.Context(), kc, ns, args[0], rs)
		if err != nil {
			return nil, err
		}
		state := map[bool]string{true: "set to " + string(rs), false: "already " + string(rs)}[changed]
		return &vmOutcome{
			api.VMResult{Name: args[0], Namespace: ns, Action: verb, Changed: changed, RunStrategy: string(rs)},
			fmt.Sprintf("virtualmachine %s/%s %s\n", ns, args[0], state),
		}, nil
	})
}

func newVMRestartCmd(g *globalOptions) *cobra.Command {
	return vmLifecycleCmd(g, "restart NAME", "Restart a running VM (its instance is replaced)", 1, nil, func(cmd *cobra.Command, kc vmlaunch.Cluster, ns string, args []string) (*vmOutcome, error) {
		if err := vmlaunch.Restart(cmd.Context(), kc, ns, args[0]); err != nil {
			return nil, err
		}
		return &vmOutcome{
			api.VMResult{Name: args[0], Namespace: ns, Action: api.VMActionRestart, Changed: true},
			fmt.Sprintf("virtualmachine %s/%s restarting\n", ns, args[0]),
		}, nil
	})
}

func newVMDeleteCmd(g *globalOptions) *cobra.Command {
	return vmLifecycleCmd(g, "delete NAME", "Delete a VM and its root disk; attached data volumes stay", 1, nil, func(cmd *cobra.Command, kc vmlaunch.Cluster, ns string, args []string) (*vmOutcome, error) {
		kept, err := vmlaunch.Delete(cmd.Context(), kc, ns, args[0])
		if err != nil {
			return nil, err
		}
		msg := fmt.Sprintf("virtualmachine %s/%s deleted\n", ns, args[0])
		if len(kept) > 0 {
			msg += fmt.Sprintf("data volumes kept: %s\n", strings.Join(kept, ", "))
		}
		return &vmOutcome{api.VMResult{Name: args[0], Namespace: ns, Action: api.VMActionDelete, Changed: true, KeptVolumes: kept}, msg}, nil
	})
}

func newVMMigrateCmd(g *globalOptions) *cobra.Command {
	var cancel bool
	cmd := vmLifecycleCmd(g, "migrate NAME", "Live-migrate a running VM to another node, or cancel its migration", 1, nil, func(cmd *cobra.Command, kc vmlaunch.Cluster, ns string, args []string) (*vmOutcome, error) {
		if cancel {
			names, err := vmlaunch.CancelMigration(cmd.Context(), kc, ns, args[0])
			if err != nil {
				return nil, err
			}
			text := ""
			for _, n := range names {
				text += fmt.Sprintf("virtualmachineinstancemigration %s/%s cancelled\n", ns, n)
			}
			return &vmOutcome{api.VMResult{Name: args[0], Namespace: ns, Action: api.VMActionCancelMigration, Changed: true, Migration: names[0]}, text}, nil
		}
		m, err := vmlaunch.Migrate(cmd.Context(), kc, ns, args[0])
		if err != nil {
			return nil, err
		}
		return &vmOutcome{
			api.VMResult{Name: args[0], Namespace: ns, Action: api.VMActionMigrate, Changed: true, Migration: m.Name},
			fmt.Sprintf("virtualmachineinstancemigration %s/%s created\n", ns, m.Name),
		}, nil
	})
	cmd.Flags().BoolVar(&cancel, "cancel", false, "cancel the VM's migration in progress (KubeVirt's way: its migration object is deleted; the VM stays where it runs)")
	return cmd
}

func newVMVolumeCmd(g *globalOptions, attach bool) *cobra.Command {
	use, short := "attach-volume VM VOLUME", "Attach a data volume to a VM (applied at its next start when it runs)"
	do, verb, volumes, action := vmlaunch.DetachVolume, "detached from", listAttachedVolumes, api.VMActionDetachVolume
	if attach {
		do, verb, volumes, action = vmlaunch.AttachVolume, "attached to", listVolumes, api.VMActionAttachVolume
	} else {
		use, short = "detach-volume VM VOLUME", "Detach a data volume from a VM; the volume stays"
	}
	return vmLifecycleCmd(g, use, short, 2, volumes, func(cmd *cobra.Command, kc vmlaunch.Cluster, ns string, args []string) (*vmOutcome, error) {
		change, err := do(cmd.Context(), kc, ns, args[0], args[1])
		if err != nil {
			return nil, err
		}
		done := &vmOutcome{result: api.VMResult{Name: args[0], Namespace: ns, Action: action, Changed: change.Changed, Volume: args[1], Pending: change.Pending}}
		switch {
		case !change.Changed:
			done.text = fmt.Sprintf("volume %s: nothing to do\n", args[1])
		case change.Pending:
			done.text = fmt.Sprintf("volume %s %s virtualmachine %s/%s; it takes effect when the VM next starts (imagectl vm restart)\n", args[1], verb, ns, args[0])
		default:
			done.text = fmt.Sprintf("volume %s %s virtualmachine %s/%s\n", args[1], verb, ns, args[0])
		}
		return done, nil
	})
}
