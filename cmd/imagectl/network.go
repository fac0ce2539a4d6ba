package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/imagepipe/imagepipe/internal/kube"
	"github.com/imagepipe/imagepipe/internal/tenantnet"
	"github.com/imagepipe/imagepipe/pkg/api"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
)

func newNetworkCmd(g *globalOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "network",
		Short: "Manage private networks that VMs attach to",
		Long: `A private network is a layer-2 network of the tenant's own on one hub, on an
IPv4 subnet the tenant chooses. image-syncer gives it a namespace of its own
(NAMESPACE-net-NAME) whose primary network it is: an OVN-Kubernetes user
defined network with persistent addresses, so its VMs keep their addresses
when they live-migrate. imagectl vm create --network NAME puts a VM there;
the other vm commands reach it with -n and that namespace.

A network is deleted only when no VM is on it.`,
	}
	groupCommand(cmd)
	cmd.AddCommand(newNetworkCreateCmd(g), newNetworkListCmd(g), newNetworkGetCmd(g), newNetworkDeleteCmd(g))
	return cmd
}

type networkOptions struct {
	*globalOptions
	kubeFlags
	out     outputFlags
	subnet  string
	quota   []string
	wait    bool
	timeout time.Duration
}

// validateWait checks -o, --wait and --timeout.
func (o *networkOptions) validateWait(cmd *cobra.Command) error {
	if err := o.out.validate(); err != nil {
		return err
	}
	return checkWait(o.wait, o.timeout, cmd.Flags().Changed("timeout"))
}

func newNetworkCreateCmd(g *globalOptions) *cobra.Command {
	o := &networkOptions{globalOptions: g}
	cmd := &cobra.Command{
		Use:   "create NAME --subnet CIDR",
		Short: "Create a private network",
		Long: `Creates the PrivateNetwork NAME in the namespace, on --subnet: an IPv4 network
address with a prefix length from 8 to 29 that overlaps none of the
namespace's other networks and none of the ranges OVN-Kubernetes keeps
(100.64.0.0/16, 100.65.0.0/16, 100.88.0.0/16, 169.254.0.0/16) or no network
can use (0/8, 127/8, 224/4, 240/4). With --wait it waits until the hub has
provisioned it.

--quota gives the network a share of the tenant's quota: of what the
provider's quotas in the tenant's namespace bound, the network's namespace
may use its share and the tenant's namespace keeps the rest. A bounded
resource the share does not name is 0 on the network, so name each one
whose use the network needs (vms, cpu and memory stand for
count/virtualmachines.kubevirt.io, requests.cpu and requests.memory). The
share cannot change later.`,
		Example: `  imagectl network create frontend --subnet 10.10.0.0/24 --wait
  imagectl network create frontend --subnet 10.10.0.0/24 --quota vms=2 --quota cpu=4 --quota memory=8Gi
  imagectl vm create web --network frontend --image acme/rhel:9 --template simple_vm`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE:              func(cmd *cobra.Command, args []string) error { return runNetworkCreate(cmd, o, args[0]) },
	}
	cmd.Flags().StringVar(&o.subnet, "subnet", "", "IPv4 subnet, e.g. 10.10.0.0/24 (required)")
	cmd.Flags().StringArrayVar(&o.quota, "quota", nil, "RESOURCE=QUANTITY: the network's share of the tenant's quota, repeatable (vms, cpu, memory, or a ResourceQuota resource name)")
	cmd.Flags().BoolVar(&o.wait, "wait", false, "wait until the hub has provisioned the network")
	cmd.Flags().DurationVar(&o.timeout, "timeout", 2*time.Minute, "with --wait: how long to wait")
	addKubeFlags(cmd, &o.kubeFlags)
	addOutputFlag(cmd, &o.out, resultFormats...)
	return cmd
}

func runNetworkCreate(cmd *cobra.Command, o *networkOptions, name string) error {
	if err := o.validateWait(cmd); err != nil {
		return err
	}
	if err := tenantnet.CheckName(name); err != nil {
		return &usageError{err}
	}
	if o.subnet == "" {
		return &usageError{errors.New("name the network's subnet with --subnet, e.g. 10.10.0.0/24")}
	}
	subnet, err := tenantnet.ParseSubnet(o.subnet)
	if err != nil {
		return &usageError{err}
	}
	quota, err := parseQuota(o.quota)
	if err != nil {
		return &usageError{err}
	}
	kc, ns, err := o.kubeFlags.client()
	if err != nil {
		return err
	}
	if _, err := tenantnet.Namespace(ns, name); err != nil {
		return &usageError{err}
	}
	ctx := cmd.Context()
	var list v1alpha1.PrivateNetworkList
	if err := kc.List(ctx, ns, "", &list); err != nil {
		return fmt.Errorf("listing the networks of %s: %w", ns, err)
	}
	var others []tenantnet.Network
	for _, pn := range list.Items {
		if pn.Name == name {
			return fmt.Errorf("network %s already exists in %s (subnet %s)", name, ns, pn.Spec.IPv4CIDR)
		}
		others = append(others, tenantnet.Network{Name: pn.Name, Subnet: pn.Spec.IPv4CIDR})
	}
	if other, ok := tenantnet.Overlap(subnet, others); ok {
		return &usageError{fmt.Errorf("subnet %s overlaps %s of network %s", subnet, other.Subnet, other.Name)}
	}
	pn := &v1alpha1.PrivateNetwork{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       v1alpha1.PrivateNetworkSpec{IPv4CIDR: subnet.String(), Quota: quota},
	}
	if err := kc.Create(ctx, pn); err != nil {
		return fmt.Errorf("creating network %s: %w", name, err)
	}
	if o.wait {
		if pn, err = waitNetworkReady(ctx, kc, ns, name, o.timeout); err != nil {
			return err
		}
	}
	n := networkView(pn)
	return o.out.show(cmd.OutOrStdout(), view{data: n, names: []string{"privatenetwork/" + name}, table: func(w io.Writer, _ bool) error {
		_, err := fmt.Fprintf(w, "privatenetwork %s/%s created on %s\n", ns, name, n.Subnet)
		if err == nil && n.VMNamespace != "" {
			_, err = fmt.Fprintf(w, "its VMs live in namespace %s: imagectl vm create NAME --network %s ...\n", n.VMNamespace, name)
		}
		return err
	}})
}

// waitNetworkReady waits until the hub reports the network provisioned,
// or fails with the reason it gives for not doing so.
// quotaAliases are the short names --quota takes for the resources a VM
// uses.
var quotaAliases = map[string]corev1.ResourceName{
	"vms": "count/virtualmachines.kubevirt.io", "cpu": corev1.ResourceRequestsCPU, "memory": corev1.ResourceRequestsMemory,
}

// parseQuota reads --quota RESOURCE=QUANTITY flags.
func parseQuota(flags []string) (corev1.ResourceList, error) {
	if len(flags) == 0 {
		return nil, nil
	}
	out := corev1.ResourceList{}
	for _, f := range flags {
		k, v, ok := strings.Cut(f, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--quota %q: want RESOURCE=QUANTITY, e.g. vms=2 or requests.cpu=4", f)
		}
		res := corev1.ResourceName(k)
		if alias, ok := quotaAliases[k]; ok {
			res = alias
		}
		q, err := resource.ParseQuantity(v)
		if err != nil || q.Sign() < 0 {
			return nil, fmt.Errorf("--quota %s: %q is not a quantity of 0 or more", k, v)
		}
		if _, dup := out[res]; dup {
			return nil, fmt.Errorf("--quota names %s twice", res)
		}
		out[res] = q
	}
	if len(out) > 16 {
		return nil, fmt.Errorf("--quota names %d resources; at most 16", len(out))
	}
	return out, nil
}

func waitNetworkReady(ctx context.Context, kc *kube.Client, ns, name string, timeout time.Duration) (*v1alpha1.PrivateNetwork, error) {
	var pn v1alpha1.PrivateNetwork
	err := pollUntil(ctx, timeout, fmt.Errorf("network %s is not ready after %s; imagectl network get %s shows why", name, timeout, name), func(ctx context.Context) (bool, error) {
		if err := kc.Get(ctx, ns, name, &pn); err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(pn.Status.Conditions, v1alpha1.ConditionReady)
		switch {
		case c == nil || c.ObservedGeneration != pn.Generation:
			return false, nil
		case c.Status == metav1.ConditionTrue:
			return true, nil
		case c.Reason != v1alpha1.ReasonVMsPresent && c.Reason != v1alpha1.ReasonQuotaPending:
			return false, fmt.Errorf("network %s was not provisioned (%s): %s", name, c.Reason, c.Message)
		}
		return false, nil
	})
	return &pn, err
}

func newNetworkListCmd(g *globalOptions) *cobra.Command {
	o := &networkOptions{globalOptions: g}
	cmd := &cobra.Command{
		Use:               "list",
		Short:             "List the namespace's private networks",
		Long:              `Lists the networks, their subnets, the namespace of their VMs, how many VMs are on each and whether the hub has provisioned them; -o wide adds the VMs' names and the reason a network is not ready.`,
		Args:              cobra.NoArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE:              func(cmd *cobra.Command, _ []string) error { return runNetworkShow(cmd, o, "") },
	}
	addKubeFlags(cmd, &o.kubeFlags)
	addOutputFlag(cmd, &o.out, listFormats...)
	return cmd
}

func newNetworkGetCmd(g *globalOptions) *cobra.Command {
	o := &networkOptions{globalOptions: g}
	cmd := &cobra.Command{
		Use:               "get NAME",
		Short:             "Show one private network",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeArgs(&o.kubeFlags, listNetworks),
		RunE:              func(cmd *cobra.Command, args []string) error { return runNetworkShow(cmd, o, args[0]) },
	}
	addKubeFlags(cmd, &o.kubeFlags)
	addOutputFlag(cmd, &o.out, listFormats...)
	return cmd
}

func listNetworks(ctx context.Context, kc *kube.Client, ns string, _ []string) ([]string, error) {
	var list v1alpha1.PrivateNetworkList
	if err := kc.List(ctx, ns, "", &list); err != nil {
		return nil, err
	}
	names := make([]string, len(list.Items))
	for i, pn := range list.Items {
		names[i] = pn.Name
	}
	return names, nil
}

func runNetworkShow(cmd *cobra.Command, o *networkOptions, name string) error {
	if err := o.out.validate(); err != nil {
		return err
	}
	kc, ns, err := o.kubeFlags.client()
	if err != nil {
		return err
	}
	var items []v1alpha1.PrivateNetwork
	if name != "" {
		pn, err := getNetwork(cmd.Context(), kc, ns, name)
		if err != nil {
			return err
		}
		items = append(items, *pn)
	} else {
		var list v1alpha1.PrivateNetworkList
		if err := kc.List(cmd.Context(), ns, "", &list); err != nil {
			return fmt.Errorf("listing the networks of %s: %w", ns, err)
		}
		items = list.Items
	}
	nets := make([]api.Network, len(items))
	names := make([]string, len(items))
	for i := range items {
		nets[i], names[i] = networkView(&items[i]), "privatenetwork/"+items[i].Name
	}
	var data any = nets
	if name != "" {
		data = nets[0]
	}
	return o.out.show(cmd.OutOrStdout(), view{data: data, names: names, table: func(w io.Writer, wide bool) error {
		return table(func(tw *tabwriter.Writer) {
			fmt.Fprint(tw, "NAME\tSUBNET\tVM NAMESPACE\tVMS\tREADY")
			if wide {
				fmt.Fprint(tw, "\tREASON\tVM NAMES")
			}
			fmt.Fprintln(tw)
			for _, n := range nets {
				ready := n.Ready
				if n.Deleting {
					ready = "Deleting"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s", n.Name, n.Subnet, orDash(n.VMNamespace), n.VMCount, ready)
				if wide {
					reason := ""
					if n.Ready != "True" {
						reason = strings.TrimSpace(n.Reason + ": " + n.Message)
					}
					fmt.Fprintf(tw, "\t%s\t%s", orDash(strings.Trim(reason, ": ")), orDash(strings.Join(n.VMs, ",")))
				}
				fmt.Fprintln(tw)
			}
		})(w)
	}})
}

func getNetwork(ctx context.Context, kc *kube.Client, ns, name string) (*v1alpha1.PrivateNetwork, error) {
	var pn v1alpha1.PrivateNetwork
	err := kc.Get(ctx, ns, name, &pn)
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("no network %s in namespace %s (imagectl network list shows them)", name, ns)
	}
	if err != nil {
		return nil, fmt.Errorf("reading network %s: %w", name, err)
	}
	return &pn, nil
}

func networkView(pn *v1alpha1.PrivateNetwork) api.Network {
	n := api.Network{
		Name: pn.Name, Namespace: pn.Namespace, Subnet: pn.Spec.IPv4CIDR, VMNamespace: pn.Status.Namespace,
		Ready: "Unknown", VMs: pn.Status.VirtualMachines, VMCount: pn.Status.VirtualMachineCount,
		Deleting: !pn.DeletionTimestamp.IsZero(),
	}
	if c := meta.FindStatusCondition(pn.Status.Conditions, v1alpha1.ConditionReady); c != nil && c.ObservedGeneration == pn.Generation {
		n.Ready, n.Reason, n.Message = string(c.Status), c.Reason, c.Message
	}
	return n
}

func newNetworkDeleteCmd(g *globalOptions) *cobra.Command {
	o := &networkOptions{globalOptions: g}
	cmd := &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a private network no VM uses",
		Long: `Deletes the network, its namespace and its OVN-Kubernetes network. A network
that VMs are on is refused, naming them: delete them first. A VM created
while the deletion is under way holds the network until it is deleted too.
With --wait it waits until the network is gone.`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeArgs(&o.kubeFlags, listNetworks),
		RunE:              func(cmd *cobra.Command, args []string) error { return runNetworkDelete(cmd, o, args[0]) },
	}
	cmd.Flags().BoolVar(&o.wait, "wait", false, "wait until the network is gone")
	cmd.Flags().DurationVar(&o.timeout, "timeout", 2*time.Minute, "with --wait: how long to wait")
	addKubeFlags(cmd, &o.kubeFlags)
	addOutputFlag(cmd, &o.out, resultFormats...)
	return cmd
}

func runNetworkDelete(cmd *cobra.Command, o *networkOptions, name string) error {
	if err := o.validateWait(cmd); err != nil {
		return err
	}
	kc, ns, err := o.kubeFlags.client()
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	pn, err := getNetwork(ctx, kc, ns, name)
	if err != nil {
		return err
	}
	// Only the namespace the hub made for the network can hold its VMs; a
	// network refused before that has none.
	if vmNS := pn.Status.Namespace; vmNS != "" {
		var vms kubevirtv1.VirtualMachineList
		if err := kc.List(ctx, vmNS, "", &vms); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("listing the VMs on network %s: %w", name, err)
		}
		if len(vms.Items) > 0 {
			names := make([]string, len(vms.Items))
			for i, vm := range vms.Items {
				names[i] = vm.Name
			}
			return fmt.Errorf("network %s is in use by %d VM(s): %s (namespace %s); delete them first: imagectl vm delete NAME -n %s",
				name, len(names), strings.Join(names, ", "), vmNS, vmNS)
		}
	}
	if err := kc.Delete(ctx, pn, false); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting network %s: %w", name, err)
	}
	if o.wait {
		if err := waitNetworkGone(ctx, kc, ns, name, o.timeout); err != nil {
			return err
		}
	}
	return o.out.show(cmd.OutOrStdout(), view{data: networkView(pn), names: []string{"privatenetwork/" + name}, table: func(w io.Writer, _ bool) error {
		_, err := fmt.Fprintf(w, "privatenetwork %s/%s deleted\n", ns, name)
		return err
	}})
}

func waitNetworkGone(ctx context.Context, kc *kube.Client, ns, name string, timeout time.Duration) error {
	return pollUntil(ctx, timeout, fmt.Errorf("network %s is still there after %s; imagectl network get %s shows why", name, timeout, name), func(ctx context.Context) (bool, error) {
		var pn v1alpha1.PrivateNetwork
		err := kc.Get(ctx, ns, name, &pn)
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})
}

// networkNamespace returns, for vm create --network, the namespace of the
// tenant's images (home) and the namespace of the network's VMs. Only the
// networks of home are found, so a VM never lands on another tenant's.
func networkNamespace(ctx context.Context, kc *kube.Client, home, name string) (images, vms string, err error) {
	pn, err := getNetwork(ctx, kc, home, name)
	if err != nil {
		return "", "", err
	}
	c := meta.FindStatusCondition(pn.Status.Conditions, v1alpha1.ConditionReady)
	switch {
	case !pn.DeletionTimestamp.IsZero():
		return "", "", fmt.Errorf("network %s is being deleted", name)
	case c != nil && c.Status == metav1.ConditionFalse:
		return "", "", fmt.Errorf("network %s is not ready (%s): %s", name, c.Reason, c.Message)
	case c == nil || c.Status != metav1.ConditionTrue || pn.Status.Namespace == "":
		return "", "", fmt.Errorf("network %s is not provisioned yet; imagectl network create --wait waits for it", name)
	}
	return home, pn.Status.Namespace, nil
}
