package netsync

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/imagepipe/imagepipe/internal/tenantnet"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
)

// LabelLoadBalancer names, on the Service and EndpointSlice image-syncer
// keeps for a LoadBalancer, the LoadBalancer; the syncer caches only
// Services and EndpointSlices that carry it.
const LabelLoadBalancer = "imagepipe.io/load-balancer"

// endpointSliceManager is the EndpointSlices' managed-by value, which
// keeps Kubernetes' and OVN-Kubernetes' own controllers off them.
const endpointSliceManager = "image-syncer.imagepipe.io"

// OVN-Kubernetes reads a primary user-defined network's endpoints from
// EndpointSlices that carry the service's name under this label and the
// network's name under this annotation (ovn-kubernetes go-controller/pkg/types).
const (
	ovnServiceNameLabel   = "k8s.ovn.org/service-name"
	ovnEndpointsNetworkAn = "k8s.ovn.org/endpointslice-network"
)

var vmiKind = schema.GroupVersionKind{Group: "kubevirt.io", Version: "v1", Kind: "VirtualMachineInstance"}

// LoadBalancers keeps, for each LoadBalancer, a Service of type
// LoadBalancer without a selector and an EndpointSlice of its hosts'
// addresses, and reports the external addresses and the hosts.
type LoadBalancers struct {
	Client client.Client
	// APIReader reads from the API server itself, past the cache; nil:
	// Client.
	APIReader client.Reader
	// Bounds bound each tenant's load balancers and exposed ports.
	Bounds Bounds
	// NodePorts lets the hub allocate a NodePort for each exposed port, as
	// load-balancer implementations that forward to nodes need. Off, the
	// Services hold none: NodePorts are one range for the whole hub.
	NodePorts bool
	Logger    *slog.Logger
}

// SetupWithManager registers the reconciler; it watches the Services and
// EndpointSlices it owns and, when the hub serves them, KubeVirt's
// VirtualMachineInstances, whose addresses and readiness it passes on.
func (r *LoadBalancers) SetupWithManager(mgr ctrl.Manager) error {
	b := ctrl.NewControllerManagedBy(mgr).Named("loadbalancer").For(&v1alpha1.LoadBalancer{}).
		Owns(&corev1.Service{}).Owns(&discoveryv1.EndpointSlice{}).
		// A load balancer made or deleted moves the tenant's others
		// within or past its bounds.
		Watches(&v1alpha1.LoadBalancer{}, handler.EnqueueRequestsFromMapFunc(r.tenantsBalancers))
	if _, err := mgr.GetRESTMapper().RESTMapping(vmiKind.GroupKind(), vmiKind.Version); err == nil {
		vmi := &unstructured.Unstructured{}
		vmi.SetGroupVersionKind(vmiKind)
		vm := &metav1.PartialObjectMetadata{}
		vm.SetGroupVersionKind(vmKind)
		b = b.Watches(vmi, handler.EnqueueRequestsFromMapFunc(r.balancersOf)).
			Watches(vm, handler.EnqueueRequestsFromMapFunc(r.balancersOf)).
			Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(r.balancersOfPod))
	} else {
		r.logger().Info("KubeVirt's VirtualMachineInstances are not served here; load balancers find no hosts", "error", err)
	}
	return b.Complete(r)
}

// balancersOf lists the LoadBalancers that name a VMI as a host.
func (r *LoadBalancers) balancersOf(ctx context.Context, vmi client.Object) []reconcile.Request {
	var list v1alpha1.LoadBalancerList
	if err := r.Client.List(ctx, &list, client.InNamespace(vmi.GetNamespace())); err != nil {
		r.logger().Error("listing load balancers", "namespace", vmi.GetNamespace(), "error", err)
		return nil
	}
	var out []reconcile.Request
	for _, lb := range list.Items {
		if slices.Contains(lb.Spec.Hosts, vmi.GetName()) {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&lb)})
		}
	}
	return out
}

// labelDomain is KubeVirt's label on a virt-launcher pod: the name of the
// instance it runs.
const labelDomain = "kubevirt.io/domain"

// balancersOfPod lists the LoadBalancers that name the instance a
// virt-launcher pod runs, whose addresses the pod's decide.
func (r *LoadBalancers) balancersOfPod(ctx context.Context, pod client.Object) []reconcile.Request {
	name := pod.GetLabels()[labelDomain]
	if name == "" {
		return nil
	}
	return r.balancersOf(ctx, &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: pod.GetNamespace(), Name: name}})
}

// tenantsBalancers lists the load balancers of lb's tenant.
func (r *LoadBalancers) tenantsBalancers(ctx context.Context, lb client.Object) []reconcile.Request {
	var ns corev1.Namespace
	if err := r.Client.Get(ctx, client.ObjectKey{Name: lb.GetNamespace()}, &ns); err != nil {
		return nil
	}
	all, err := balancersOfTenant(ctx, r.Client, tenantOf(&ns))
	if err != nil {
		r.logger().Error("listing a tenant's load balancers", "namespace", lb.GetNamespace(), "error", err)
		return nil
	}
	return requestsOf(all)
}

// Reconcile brings one LoadBalancer's Service and EndpointSlice to what it
// asks for and reports on them. Deleting the LoadBalancer deletes both
// through their owner references.
func (r *LoadBalancers) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var lb v1alpha1.LoadBalancer
	if err := r.Client.Get(ctx, req.NamespacedName, &lb); err != nil || !lb.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	before := lb.DeepCopy()
	var ns corev1.Namespace
	if err := r.Client.Get(ctx, client.ObjectKey{Name: lb.Namespace}, &ns); err != nil {
		return reconcile.Result{}, err
	}
	admits, err := r.addressesOf(ctx, &ns)
	if err != nil {
		return reconcile.Result{}, err
	}
	hosts, missing, err := r.hosts(ctx, &lb, admits)
	if err != nil {
		return reconcile.Result{}, err
	}
	lb.Status.Hosts = hosts
	lb.Status.Addresses = nil
	// A load balancer that holds its Service is judged from the cache, as
	// its hosts come and go; one asking for a Service, from the API server.
	counts := cmp.Or[client.Reader](r.APIReader, r.Client)
	var held corev1.Service
	if r.Client.Get(ctx, client.ObjectKeyFromObject(&lb), &held) == nil && metav1.IsControlledBy(&held, &lb) {
		counts = r.Client
	}
	why, err := r.Bounds.admitLoadBalancer(ctx, r.Client, counts, &lb, tenantOf(&ns))
	if err != nil {
		return reconcile.Result{}, err
	}
	// Past the tenant's bounds, or before any host exists, the load
	// balancer holds nothing of the hub's: no Service, no address, no port.
	reason := v1alpha1.ReasonTenantLimit
	if why == "" && len(missing) == len(lb.Spec.Hosts) {
		reason, why = v1alpha1.ReasonHostsMissing, fmt.Sprintf("no VM of namespace %s is named %s; the load balancer gets its Service once one is", lb.Namespace, strings.Join(missing, ", "))
	}
	if why != "" {
		if err := r.removeService(ctx, &lb); err != nil {
			return reconcile.Result{}, err
		}
		setLBCondition(&lb, metav1.ConditionFalse, reason, why)
		return reconcile.Result{}, r.writeLBStatus(ctx, &lb, before)
	}
	svc, used, err := r.ensureService(ctx, &lb)
	if err != nil {
		return reconcile.Result{}, err
	}
	if used {
		setLBCondition(&lb, metav1.ConditionFalse, v1alpha1.ReasonServiceUsed,
			fmt.Sprintf("Service %s/%s exists and is not this load balancer's; choose another name", lb.Namespace, lb.Name))
		return reconcile.Result{}, r.writeLBStatus(ctx, &lb, before)
	}
	if err := r.ensureEndpoints(ctx, &lb, &ns, hosts); err != nil {
		return reconcile.Result{}, err
	}
	for _, in := range svc.Status.LoadBalancer.Ingress {
		if a := cmp.Or(in.IP, in.Hostname); a != "" && len(lb.Status.Addresses) < 8 {
			lb.Status.Addresses = append(lb.Status.Addresses, a)
		}
	}
	ready := 0
	for _, h := range hosts {
		if h.Ready {
			ready++
		}
	}
	switch {
	case len(missing) > 0:
		setLBCondition(&lb, metav1.ConditionFalse, v1alpha1.ReasonHostsMissing,
			fmt.Sprintf("no VM of namespace %s is named %s", lb.Namespace, strings.Join(missing, ", ")))
	case ready == 0:
		setLBCondition(&lb, metav1.ConditionFalse, v1alpha1.ReasonNoReadyHosts, "no host runs and has an address yet")
	case len(lb.Status.Addresses) == 0:
		setLBCondition(&lb, metav1.ConditionFalse, v1alpha1.ReasonAddressPending, "waiting for the hub to assign an external address")
	default:
		setLBCondition(&lb, metav1.ConditionTrue, v1alpha1.ReasonExposed,
			fmt.Sprintf("%s serves %d of %d hosts", strings.Join(lb.Status.Addresses, ", "), ready, len(hosts)))
	}
	return reconcile.Result{}, r.writeLBStatus(ctx, &lb, before)
}

// addressesOf says which host addresses the namespace's network admits.
// An instance's addresses are what virt-handler reports, which includes
// what the guest's agent says: a hostile guest could name any address,
// and the load balancer would send traffic there. In a private network's
// namespace only addresses of its subnet are taken (none while the network
// is gone). On the pod network, nil: an address is taken only when the
// instance's own virt-launcher pod holds it (podAddresses).
func (r *LoadBalancers) addressesOf(ctx context.Context, ns *corev1.Namespace) (func(netip.Addr) bool, error) {
	of, ok := ns.Annotations[tenantnet.AnnotationNetworkOf]
	if !ok {
		return nil, nil
	}
	home, name, _ := strings.Cut(of, "/")
	var pn v1alpha1.PrivateNetwork
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: home, Name: name}, &pn)
	if apierrors.IsNotFound(err) {
		return func(netip.Addr) bool { return false }, nil
	}
	if err != nil {
		return nil, err
	}
	subnet, err := netip.ParsePrefix(pn.Spec.IPv4CIDR)
	if err != nil {
		return func(netip.Addr) bool { return false }, nil
	}
	return subnet.Contains, nil
}

// LabelCreatedBy is KubeVirt's label on a virt-launcher pod: the UID of the
// instance it runs. Tenants cannot write pods.
const LabelCreatedBy = "kubevirt.io/created-by"

// LabelVirtLauncher selects KubeVirt's virt-launcher pods, the only pods
// the syncer caches.
const LabelVirtLauncher = "kubevirt.io=virt-launcher"

// podAddresses says whether an address is one a pod running vmi holds on
// the pod network, as its kubelet reported it: during a migration, either
// pod's.
func (r *LoadBalancers) podAddresses(ctx context.Context, vmi client.Object) (func(netip.Addr) bool, error) {
	var pods corev1.PodList
	if err := r.Client.List(ctx, &pods, client.InNamespace(vmi.GetNamespace()), client.MatchingLabels{LabelCreatedBy: string(vmi.GetUID())}); err != nil {
		return nil, fmt.Errorf("listing the pods of instance %s/%s: %w", vmi.GetNamespace(), vmi.GetName(), err)
	}
	held := map[netip.Addr]bool{}
	for _, p := range pods.Items {
		for _, ip := range p.Status.PodIPs {
			if a, err := netip.ParseAddr(ip.IP); err == nil {
				held[a] = true
			}
		}
	}
	return func(a netip.Addr) bool { return held[a] }, nil
}

// hosts reads each host's instance: its address on the network it is
// attached to through the pod (its primary network), if admits takes it
// (nil: if its own pod holds it), and whether it is ready. missing names the hosts that are no VM of the
// namespace.
func (r *LoadBalancers) hosts(ctx context.Context, lb *v1alpha1.LoadBalancer, admits func(netip.Addr) bool) (hosts []v1alpha1.LoadBalancerHost, missing []string, err error) {
	vms, err := vmsIn(ctx, r.Client, lb.Namespace)
	if err != nil {
		return nil, nil, err
	}
	for _, name := range lb.Spec.Hosts {
		h := v1alpha1.LoadBalancerHost{Name: name}
		if _, found := slices.BinarySearch(vms, name); !found {
			missing = append(missing, name)
			hosts = append(hosts, h)
			continue
		}
		vmi := &unstructured.Unstructured{}
		vmi.SetGroupVersionKind(vmiKind)
		err := r.Client.Get(ctx, client.ObjectKey{Namespace: lb.Namespace, Name: name}, vmi)
		switch {
		case err == nil:
			h.IP, h.Ready = instanceAddress(vmi)
			takes := admits
			if takes == nil {
				if takes, err = r.podAddresses(ctx, vmi); err != nil {
					return nil, nil, err
				}
			}
			if a, err := netip.ParseAddr(h.IP); err == nil && !takes(a) {
				r.logger().Info("a host's address is neither its pod's nor on its network, and not used", "loadbalancer", client.ObjectKeyFromObject(lb), "host", name, "address", h.IP)
				h.IP, h.Ready = "", false
			}
		case !apierrors.IsNotFound(err) && !meta.IsNoMatchError(err):
			return nil, nil, fmt.Errorf("reading the instance of VM %s/%s: %w", lb.Namespace, name, err)
		}
		hosts = append(hosts, h)
	}
	return hosts, missing, nil
}

// instanceAddress is a VMI's IPv4 address on its pod network and whether
// it is Running and Ready with that address.
func instanceAddress(vmi *unstructured.Unstructured) (ip string, ready bool) {
	pod := ""
	networks, _, _ := unstructured.NestedSlice(vmi.Object, "spec", "networks")
	for _, n := range networks {
		if m, ok := n.(map[string]any); ok && m["pod"] != nil {
			pod, _ = m["name"].(string)
		}
	}
	ifaces, _, _ := unstructured.NestedSlice(vmi.Object, "status", "interfaces")
	for _, i := range ifaces {
		m, _ := i.(map[string]any)
		if name, _ := m["name"].(string); pod != "" && name != pod {
			continue
		}
		addrs, _, _ := unstructured.NestedStringSlice(m, "ipAddresses")
		if a, _ := m["ipAddress"].(string); a != "" {
			addrs = append([]string{a}, addrs...)
		}
		for _, a := range addrs {
			if p, err := netip.ParseAddr(a); err == nil && p.Is4() {
				ip = p.String()
				break
			}
		}
		break
	}
	phase, _, _ := unstructured.NestedString(vmi.Object, "status", "phase")
	conds, _, _ := unstructured.NestedSlice(vmi.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == "Ready" {
			ready = m["status"] == "True"
		}
	}
	return ip, ready && phase == "Running" && ip != ""
}

// removeService deletes the Service and EndpointSlice lb controls, if any.
func (r *LoadBalancers) removeService(ctx context.Context, lb *v1alpha1.LoadBalancer) error {
	for _, o := range []client.Object{&corev1.Service{}, &discoveryv1.EndpointSlice{}} {
		key := client.ObjectKeyFromObject(lb)
		if _, slice := o.(*discoveryv1.EndpointSlice); slice {
			key.Name += "-hosts"
		}
		err := r.Client.Get(ctx, key, o)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return err
		}
		if !metav1.IsControlledBy(o, lb) {
			continue
		}
		if err := r.Client.Delete(ctx, o); client.IgnoreNotFound(err) != nil {
			return err
		}
		r.logger().Info("removed what a load balancer held", "loadbalancer", client.ObjectKeyFromObject(lb), "object", key.Name)
	}
	return nil
}

// ensureService makes the LoadBalancer's Service what it asks for. used is
// true when a Service of that name exists that this LoadBalancer does not
// control; it is left alone.
func (r *LoadBalancers) ensureService(ctx context.Context, lb *v1alpha1.LoadBalancer) (svc *corev1.Service, used bool, err error) {
	want := corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, AllocateLoadBalancerNodePorts: ptr(r.NodePorts)}
	for _, p := range lb.Spec.Ports {
		want.Ports = append(want.Ports, corev1.ServicePort{
			Name: portName(p), Protocol: corev1.Protocol(p.Protocol), Port: p.Port,
			TargetPort: intstr.FromInt32(p.Target()),
		})
	}
	svc = &corev1.Service{}
	err = r.Client.Get(ctx, client.ObjectKeyFromObject(lb), svc)
	if apierrors.IsNotFound(err) {
		svc = &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: lb.Name, Namespace: lb.Namespace, Labels: map[string]string{LabelLoadBalancer: lb.Name}},
			Spec:       want,
		}
		if err := controllerutil.SetControllerReference(lb, svc, r.Client.Scheme()); err != nil {
			return nil, false, err
		}
		err = r.Client.Create(ctx, svc)
		if apierrors.IsAlreadyExists(err) {
			return nil, true, nil // there, but not labelled as ours: not in the cache
		}
		if err == nil {
			r.logger().Info("created the Service of a load balancer", "loadbalancer", client.ObjectKeyFromObject(lb))
		}
		return svc, false, err
	}
	if err != nil {
		return nil, false, err
	}
	if !metav1.IsControlledBy(svc, lb) {
		return nil, true, nil
	}
	have := svc.Spec.Ports
	same := svc.Spec.Type == want.Type && len(svc.Spec.Selector) == 0 && len(svc.Spec.ExternalIPs) == 0 && len(have) == len(want.Ports) &&
		equality.Semantic.DeepEqual(svc.Spec.AllocateLoadBalancerNodePorts, want.AllocateLoadBalancerNodePorts)
	for i := 0; same && i < len(have); i++ {
		w := want.Ports[i]
		same = have[i].Name == w.Name && have[i].Protocol == w.Protocol && have[i].Port == w.Port && have[i].TargetPort == w.TargetPort &&
			(r.NodePorts || have[i].NodePort == 0)
	}
	if same {
		return svc, false, nil
	}
	svc.Spec.Type, svc.Spec.Selector, svc.Spec.ExternalIPs = want.Type, nil, nil
	svc.Spec.AllocateLoadBalancerNodePorts = want.AllocateLoadBalancerNodePorts
	ports := make([]corev1.ServicePort, len(want.Ports))
	for i, w := range want.Ports {
		if j := slices.IndexFunc(have, func(p corev1.ServicePort) bool { return p.Port == w.Port && p.Protocol == w.Protocol }); j >= 0 && r.NodePorts {
			w.NodePort = have[j].NodePort // keep what the hub allocated
		}
		ports[i] = w // without NodePorts, any the Service held are released
	}
	svc.Spec.Ports = ports
	return svc, false, r.Client.Update(ctx, svc)
}

// ensureEndpoints keeps the EndpointSlice of the hosts' addresses. In a
// namespace whose primary network is a user-defined one it is in the form
// OVN-Kubernetes reads for that network; elsewhere in Kubernetes' own.
func (r *LoadBalancers) ensureEndpoints(ctx context.Context, lb *v1alpha1.LoadBalancer, ns *corev1.Namespace, hosts []v1alpha1.LoadBalancerHost) error {
	want := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: lb.Name + "-hosts", Namespace: lb.Namespace,
			Labels: map[string]string{LabelLoadBalancer: lb.Name, discoveryv1.LabelManagedBy: endpointSliceManager},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	if _, udn := ns.Labels[tenantnet.LabelPrimaryUDN]; udn {
		want.Labels[ovnServiceNameLabel] = lb.Name
		want.Annotations = map[string]string{ovnEndpointsNetworkAn: tenantnet.NetworkName(lb.Namespace)}
	} else {
		want.Labels[discoveryv1.LabelServiceName] = lb.Name
	}
	for _, p := range lb.Spec.Ports {
		want.Ports = append(want.Ports, discoveryv1.EndpointPort{
			Name: ptr(portName(p)), Protocol: ptr(corev1.Protocol(p.Protocol)), Port: ptr(p.Target()),
		})
	}
	for _, h := range hosts {
		if h.IP == "" {
			continue
		}
		want.Endpoints = append(want.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{h.IP},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(h.Ready), Serving: ptr(h.Ready), Terminating: ptr(false)},
			TargetRef:  &corev1.ObjectReference{APIVersion: vmiKind.GroupVersion().String(), Kind: vmiKind.Kind, Namespace: lb.Namespace, Name: h.Name},
		})
	}
	if err := controllerutil.SetControllerReference(lb, want, r.Client.Scheme()); err != nil {
		return err
	}
	var have discoveryv1.EndpointSlice
	err := r.Client.Get(ctx, client.ObjectKeyFromObject(want), &have)
	if apierrors.IsNotFound(err) {
		return r.Client.Create(ctx, want)
	}
	if err != nil {
		return err
	}
	if equality.Semantic.DeepEqual(have.Labels, want.Labels) && equality.Semantic.DeepEqual(have.Annotations, want.Annotations) &&
		equality.Semantic.DeepEqual(have.Ports, want.Ports) && equality.Semantic.DeepEqual(have.Endpoints, want.Endpoints) {
		return nil
	}
	have.Labels, have.Annotations, have.Ports, have.Endpoints = want.Labels, want.Annotations, want.Ports, want.Endpoints
	return r.Client.Update(ctx, &have)
}

// portName names a port in the Service and the EndpointSlice: tcp-443.
func portName(p v1alpha1.LoadBalancerPort) string {
	return fmt.Sprintf("%s-%d", strings.ToLower(cmp.Or(p.Protocol, "TCP")), p.Port)
}

func setLBCondition(lb *v1alpha1.LoadBalancer, status metav1.ConditionStatus, reason, message string) {
	meta.SetStatusCondition(&lb.Status.Conditions, metav1.Condition{
		Type: v1alpha1.ConditionReady, Status: status, Reason: reason, Message: message, ObservedGeneration: lb.Generation,
	})
}

// writeLBStatus patches lb's status when it differs from before's.
func (r *LoadBalancers) writeLBStatus(ctx context.Context, lb, before *v1alpha1.LoadBalancer) error {
	lb.Status.ObservedGeneration = lb.Generation
	if equality.Semantic.DeepEqual(before.Status, lb.Status) {
		return nil
	}
	return client.IgnoreNotFound(r.Client.Status().Patch(ctx, lb, client.MergeFrom(before)))
}

func (r *LoadBalancers) logger() *slog.Logger {
	if r.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return r.Logger
}

func ptr[T any](v T) *T { return &v }
