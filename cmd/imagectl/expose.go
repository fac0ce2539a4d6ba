package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/imagepipe/imagepipe/internal/kube"
	"github.com/imagepipe/imagepipe/pkg/api"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
)

type exposeOptions struct {
	*globalOptions
	kubeFlags
	out     outputFlags
	name    string
	network string
	ports   []string
	wait    bool
	timeout time.Duration
}

// maxExposedPorts and maxHosts are the LoadBalancer CRD's limits.
const (
	maxExposedPorts = 32
	maxHosts        = 64
)

func newVMExposeCmd(g *globalOptions) *cobra.Command {
	o := &exposeOptions{globalOptions: g}
	cmd := &cobra.Command{
		Use:   "expose VM... --port PORT[:TARGET][/PROTOCOL]...",
		Short: "Expose ports of VMs outside their network through a load balancer",
		Long: `Creates a load balancer that forwards external ports to the named VMs, which
must all be in one namespace, so on one network (--network NAME for the VMs
of one of the tenant's private networks). Each --port maps an external port
to a port of the VMs: 443 (443 to 443 over TCP), 80:8080 or 53/udp; an
external port is exposed once per protocol. The load balancer is named after
the first VM unless --name says otherwise.

image-syncer makes the load balancer's Service and keeps its endpoints on the
VMs that run and are ready; the hub assigns the external address, which vm
list and vm get show as EXTERNAL-IP. With --wait the command waits for it.
imagectl loadbalancer list and get (lb) show the load balancers made; they are
a command of their own, since expose takes VM names, among which "list" and
"get" would be ambiguous.`,
		Example: `  imagectl vm expose web-1 web-2 --name web --port 80:8080 --port 443:8443 --network front --wait
  imagectl vm expose dns --port 53/udp --port 53/tcp`,
		Args:              cobra.MinimumNArgs(1),
		ValidArgsFunction: completeArgs(&o.kubeFlags, listVMs),
		RunE:              func(cmd *cobra.Command, args []string) error { return runVMExpose(cmd, o, args) },
	}
	cmd.Flags().StringArrayVar(&o.ports, "port", nil, "PORT[:TARGET][/tcp|udp|sctp] to expose (repeatable; at least one)")
	cmd.Flags().StringVar(&o.name, "name", "", "name of the load balancer (default: the first VM's)")
	cmd.Flags().StringVar(&o.network, "network", "", "the VMs are on this private network of the namespace")
	cmd.Flags().BoolVar(&o.wait, "wait", false, "wait until the load balancer has an external address and a ready VM")
	cmd.Flags().DurationVar(&o.timeout, "timeout", 2*time.Minute, "with --wait: how long to wait")
	addKubeFlags(cmd, &o.kubeFlags)
	addOutputFlag(cmd, &o.out, resultFormats...)
	return cmd
}

// newLoadBalancerCmd is the loadbalancer group: what vm expose made.
func newLoadBalancerCmd(g *globalOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "loadbalancer",
		Aliases: []string{"lb"},
		Short:   "Show the load balancers vm expose made",
		Long: `Load balancers forward external ports to VMs (imagectl vm expose makes them,
vm unexpose removes them). list shows those of the namespace and of its
private networks; get shows one.`,
	}
	groupCommand(cmd)
	cmd.AddCommand(newLoadBalancerListCmd(g, false), newLoadBalancerListCmd(g, true))
	return cmd
}

// newLoadBalancerListCmd is loadbalancer list, or with one loadbalancer
// get NAME: the load balancers of the namespace and of its private
// networks, or one.
func newLoadBalancerListCmd(g *globalOptions, one bool) *cobra.Command {
	o := &vmNameOptions{globalOptions: g}
	use, short, args := "list", "List the load balancers of the namespace and of its private networks", cobra.NoArgs
	if one {
		use, short, args = "get NAME", "Show one load balancer", cobra.ExactArgs(1)
	}
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Long: short + `: the VMs each forwards to, its ports, its external
addresses and whether it is ready, or why not (TenantLimit names the hub's
bound it is past).`,
		Args:              args,
		ValidArgsFunction: completeArgs(&o.kubeFlags, listLoadBalancers),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.out.validate(); err != nil {
				return err
			}
			kc, ns, err := o.kubeFlags.client()
			if err != nil {
				return err
			}
			all, err := exposures(cmd.Context(), kc, o, ns)
			if err != nil {
				return err
			}
			var data any = all
			if one {
				i := slices.IndexFunc(all, func(e api.Exposure) bool { return e.Name == args[0] })
				if i < 0 {
					return fmt.Errorf("no load balancer %s in namespace %s or its networks", args[0], ns)
				}
				all = all[i : i+1]
				data = all[0]
			}
			names := make([]string, len(all))
			for i, e := range all {
				names[i] = "loadbalancer/" + e.Name
			}
			return o.out.show(cmd.OutOrStdout(), view{data: data, names: names, table: func(w io.Writer, _ bool) error {
				return table(func(tw *tabwriter.Writer) {
					fmt.Fprintln(tw, "NAME\tNETWORK\tHOSTS\tPORTS\tADDRESS\tREADY\tREASON")
					for _, e := range all {
						fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.Name, orDash(e.Network), strings.Join(e.Hosts, ","), strings.Join(e.Ports, ","),
							orDash(strings.Join(e.Addresses, ",")), e.Ready, orDash(e.Reason))
					}
				})(w)
			}})
		},
	}
	addKubeFlags(cmd, &o.kubeFlags)
	addNetworkFlag(cmd, &o.network)
	addOutputFlag(cmd, &o.out, listFormats...)
	return cmd
}

// exposures are the load balancers of the namespaces o.namespaces names,
// sorted by namespace and name.
func exposures(ctx context.Context, kc *kube.Client, o *vmNameOptions, ns string) ([]api.Exposure, error) {
	where, err := o.namespaces(ctx, kc, ns)
	if err != nil {
		return nil, err
	}
	out := []api.Exposure{}
	for _, n := range slices.Sorted(maps.Keys(where)) {
		var list v1alpha1.LoadBalancerList
		if err := kc.List(ctx, n, "", &list); err != nil {
			return nil, fmt.Errorf("listing the load balancers of %s: %w", n, err)
		}
		for i := range list.Items {
			e := exposureView(&list.Items[i])
			e.Network = where[n]
			out = append(out, e)
		}
	}
	return out, nil
}

// parsePorts reads --port values; it refuses a port out of range, an
// unknown protocol and an external port given twice for one protocol.
func parsePorts(specs []string) ([]v1alpha1.LoadBalancerPort, error) {
	if len(specs) == 0 {
		return nil, errors.New("name at least one port with --port, e.g. --port 80:8080")
	}
	if len(specs) > maxExposedPorts {
		return nil, fmt.Errorf("%d ports: a load balancer exposes at most %d", len(specs), maxExposedPorts)
	}
	var ports []v1alpha1.LoadBalancerPort
	seen := map[string]string{}
	for _, spec := range specs {
		rest, proto, _ := strings.Cut(spec, "/")
		proto = strings.ToUpper(proto)
		switch proto {
		case "":
			proto = "TCP"
		case "TCP", "UDP", "SCTP":
		default:
			return nil, fmt.Errorf("--port %s: protocol %q is none of tcp, udp and sctp", spec, proto)
		}
		ext, target, hasTarget := strings.Cut(rest, ":")
		p := v1alpha1.LoadBalancerPort{Protocol: proto}
		var err error
		if p.Port, err = portNumber(ext); err != nil {
			return nil, fmt.Errorf("--port %s: %w", spec, err)
		}
		p.TargetPort = p.Port
		if hasTarget {
			if p.TargetPort, err = portNumber(target); err != nil {
				return nil, fmt.Errorf("--port %s: %w", spec, err)
			}
		}
		key := fmt.Sprintf("%d/%s", p.Port, proto)
		if first, dup := seen[key]; dup {
			return nil, fmt.Errorf("--port %s: external port %s is already exposed by --port %s", spec, key, first)
		}
		seen[key] = spec
		ports = append(ports, p)
	}
	return ports, nil
}

func portNumber(s string) (int32, error) {
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("port %q: want a number from 1 to 65535", s)
	}
	return int32(n), nil
}

// checkHosts refuses VM names outside the DNS label grammar, a VM named
// twice, and too many.
func checkHosts(vms []string) error {
	if len(vms) > maxHosts {
		return fmt.Errorf("%d VMs: a load balancer has at most %d", len(vms), maxHosts)
	}
	seen := map[string]bool{}
	for _, vm := range vms {
		if errs := validation.IsDNS1123Label(vm); len(errs) > 0 {
			return fmt.Errorf("VM name %q: %s", vm, strings.Join(errs, "; "))
		}
		if seen[vm] {
			return fmt.Errorf("VM %s is named twice", vm)
		}
		seen[vm] = true
	}
	return nil
}

func runVMExpose(cmd *cobra.Command, o *exposeOptions, vms []string) error {
	if err := o.out.validate(); err != nil {
		return err
	}
	if err := checkWait(o.wait, o.timeout, cmd.Flags().Changed("timeout")); err != nil {
		return err
	}
	ports, err := parsePorts(o.ports)
	if err != nil {
		return &usageError{err}
	}
	if err := checkHosts(vms); err != nil {
		return &usageError{err}
	}
	name := o.name
	if name == "" {
		name = vms[0]
	}
	if errs := validation.IsDNS1123Label(name); len(errs) > 0 || name[0] < 'a' || name[0] > 'z' {
		return &usageError{fmt.Errorf("load balancer name %q: want a DNS label that starts with a letter (--name)", name)}
	}
	kc, ns, err := o.kubeFlags.client()
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	if o.network != "" {
		if _, ns, err = networkNamespace(ctx, kc, ns, o.network); err != nil {
			return err
		}
	}
	for _, vm := range vms {
		var v kubevirtv1.VirtualMachine
		err := kc.Get(ctx, ns, vm, &v)
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("no VM %s in namespace %s; the VMs of a load balancer are all in its namespace (vm list -n %s shows them)", vm, ns, ns)
		}
		if err != nil {
			return fmt.Errorf("reading VM %s: %w", vm, err)
		}
	}
	lb := &v1alpha1.LoadBalancer{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       v1alpha1.LoadBalancerSpec{Hosts: vms, Ports: ports},
	}
	if err := kc.Create(ctx, lb); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("load balancer %s already exists in %s; imagectl vm unexpose %s removes it, or choose another --name", name, ns, name)
		}
		return fmt.Errorf("creating load balancer %s: %w", name, err)
	}
	if o.wait {
		if lb, err = waitExposed(ctx, kc, ns, name, o.timeout); err != nil {
			return err
		}
	}
	e := exposureView(lb)
	return o.out.show(cmd.OutOrStdout(), view{data: e, names: []string{"loadbalancer/" + name}, table: func(w io.Writer, _ bool) error {
		at := "the external address is pending: vm get " + vms[0] + " shows it once assigned"
		if len(e.Addresses) > 0 {
			at = "at " + strings.Join(e.Addresses, ", ")
		}
		_, err := fmt.Fprintf(w, "loadbalancer %s/%s exposes %s of %s, %s\n", ns, name, strings.Join(e.Ports, ", "), strings.Join(vms, ", "), at)
		return err
	}})
}

// waitExposed waits until the hub reports the load balancer Ready, or
// fails with the reason it gives when that cannot come by waiting.
func waitExposed(ctx context.Context, kc *kube.Client, ns, name string, timeout time.Duration) (*v1alpha1.LoadBalancer, error) {
	var lb v1alpha1.LoadBalancer
	err := pollUntil(ctx, timeout, fmt.Errorf("load balancer %s is not ready after %s; imagectl vm get shows the VMs' state", name, timeout), func(ctx context.Context) (bool, error) {
		if err := kc.Get(ctx, ns, name, &lb); err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(lb.Status.Conditions, v1alpha1.ConditionReady)
		switch {
		case c == nil || c.ObservedGeneration != lb.Generation:
			return false, nil
		case c.Status == metav1.ConditionTrue:
			return true, nil
		case c.Reason == v1alpha1.ReasonHostsMissing || c.Reason == v1alpha1.ReasonServiceUsed || c.Reason == v1alpha1.ReasonTenantLimit:
			return false, fmt.Errorf("load balancer %s is not ready (%s): %s", name, c.Reason, c.Message)
		}
		return false, nil
	})
	return &lb, err
}

func exposureView(lb *v1alpha1.LoadBalancer) api.Exposure {
	e := api.Exposure{Name: lb.Name, Namespace: lb.Namespace, Hosts: lb.Spec.Hosts, Addresses: lb.Status.Addresses, Ready: "Unknown"}
	for _, p := range lb.Spec.Ports {
		e.Ports = append(e.Ports, fmt.Sprintf("%d:%d/%s", p.Port, p.Target(), p.Protocol))
	}
	if c := meta.FindStatusCondition(lb.Status.Conditions, v1alpha1.ConditionReady); c != nil && c.ObservedGeneration == lb.Generation {
		e.Ready, e.Reason, e.Message = string(c.Status), c.Reason, c.Message
	}
	return e
}

func newVMUnexposeCmd(g *globalOptions) *cobra.Command {
	o := &exposeOptions{globalOptions: g}
	cmd := &cobra.Command{
		Use:   "unexpose NAME",
		Short: "Remove a load balancer made by vm expose",
		Long: `Deletes the load balancer NAME (by default vm expose names it after its first
VM); the hub releases its external address. The VMs are not touched.`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeArgs(&o.kubeFlags, listLoadBalancers),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.out.validate(); err != nil {
				return err
			}
			kc, ns, err := o.kubeFlags.client()
			if err != nil {
				return err
			}
			if o.network != "" {
				if _, ns, err = networkNamespace(cmd.Context(), kc, ns, o.network); err != nil {
					return err
				}
			}
			var lb v1alpha1.LoadBalancer
			err = kc.Get(cmd.Context(), ns, args[0], &lb)
			if apierrors.IsNotFound(err) {
				return fmt.Errorf("no load balancer %s in namespace %s", args[0], ns)
			}
			if err == nil {
				err = kc.Delete(cmd.Context(), &lb, false)
			}
			if err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("deleting load balancer %s: %w", args[0], err)
			}
			return o.out.show(cmd.OutOrStdout(), view{data: exposureView(&lb), names: []string{"loadbalancer/" + args[0]}, table: func(w io.Writer, _ bool) error {
				_, err := fmt.Fprintf(w, "loadbalancer %s/%s deleted\n", ns, args[0])
				return err
			}})
		},
	}
	cmd.Flags().StringVar(&o.network, "network", "", "the load balancer is on this private network of the namespace")
	addKubeFlags(cmd, &o.kubeFlags)
	addOutputFlag(cmd, &o.out, resultFormats...)
	return cmd
}

func listLoadBalancers(ctx context.Context, kc *kube.Client, ns string, _ []string) ([]string, error) {
	var list v1alpha1.LoadBalancerList
	if err := kc.List(ctx, ns, "", &list); err != nil {
		return nil, err
	}
	names := make([]string, len(list.Items))
	for i, lb := range list.Items {
		names[i] = lb.Name
	}
	return names, nil
}
