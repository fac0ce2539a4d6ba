package netsync

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/imagepipe/imagepipe/internal/tenantnet"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
)

// AnnotationTenant is image-syncer's record of the tenant a namespace
// belongs to (internal/hub's); a network's namespace carries its home's.
const AnnotationTenant = "imagepipe.io/tenant"

// maxListedVMs bounds status.virtualMachines, as the CRD does.
const maxListedVMs = 50

// waitRequeue is how soon a network being deleted is looked at again
// while its namespace terminates; VMs going away wake it at once.
const waitRequeue = 2 * time.Second

// vmKind is KubeVirt's VirtualMachine, read as metadata only: the syncer
// links no KubeVirt API.
var vmKind = schema.GroupVersionKind{Group: "kubevirt.io", Version: "v1", Kind: "VirtualMachine"}

// indexNamespace indexes PrivateNetworks by status.namespace, to find the
// network of a VM's namespace.
const indexNamespace = "status.namespace"

// Reconciler provisions PrivateNetworks.
type Reconciler struct {
	Client client.Client
	// APIReader reads from the API server itself, past the cache; nil:
	// Client.
	APIReader client.Reader
	// TenantRole is the ClusterRole bound in a network's namespace to the
	// subjects bound to it in the network's home (config/tenant's
	// imagepipe-tenant).
	TenantRole string
	// Bounds bound each tenant's networks.
	Bounds Bounds
	Logger *slog.Logger
}

// SetupWithManager registers the reconciler; it also watches the metadata
// of VirtualMachines, when the hub serves them, to keep the counts current.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &v1alpha1.PrivateNetwork{}, indexNamespace, func(o client.Object) []string {
		if ns := o.(*v1alpha1.PrivateNetwork).Status.Namespace; ns != "" {
			return []string{ns}
		}
		return nil
	}); err != nil {
		return err
	}
	b := ctrl.NewControllerManagedBy(mgr).Named("privatenetwork").For(&v1alpha1.PrivateNetwork{}).
		// A network deleted may let a newer one of the tenant within its bound.
		Watches(&v1alpha1.PrivateNetwork{}, handler.EnqueueRequestsFromMapFunc(r.tenantsNetworks)).
		// Quotas: the provider's in a home, and the syncer's shares.
		Watches(&corev1.ResourceQuota{}, handler.EnqueueRequestsFromMapFunc(r.networksOfQuota))
	if _, err := mgr.GetRESTMapper().RESTMapping(vmKind.GroupKind(), vmKind.Version); err == nil {
		vm := &metav1.PartialObjectMetadata{}
		vm.SetGroupVersionKind(vmKind)
		b = b.Watches(vm, handler.EnqueueRequestsFromMapFunc(r.networkOfVM))
	} else {
		r.logger().Info("KubeVirt's VirtualMachines are not served here; private networks count no VMs", "error", err)
	}
	return b.Complete(r)
}

func (r *Reconciler) tenantsNetworks(ctx context.Context, pn client.Object) []reconcile.Request {
	var list v1alpha1.PrivateNetworkList
	if err := r.Client.List(ctx, &list, client.InNamespace(pn.GetNamespace())); err != nil {
		return nil
	}
	return requestsOf(list.Items)
}

// networksOfQuota lists the networks a quota bears on: all of the
// tenant's for a quota in a home namespace, the network's own for its
// share.
func (r *Reconciler) networksOfQuota(ctx context.Context, q client.Object) []reconcile.Request {
	var ns corev1.Namespace
	if err := r.Client.Get(ctx, client.ObjectKey{Name: q.GetNamespace()}, &ns); err != nil {
		return nil
	}
	home, name, ok := tenantnet.NetworkOf(ns.Annotations)
	if !ok {
		return r.tenantsNetworks(ctx, q)
	}
	return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: home, Name: name}}}
}

// live reads past the cache, for what must count at once.
func (r *Reconciler) live() client.Reader { return cmp.Or[client.Reader](r.APIReader, r.Client) }

func (r *Reconciler) networkOfVM(ctx context.Context, vm client.Object) []reconcile.Request {
	var list v1alpha1.PrivateNetworkList
	if err := r.Client.List(ctx, &list, client.MatchingFields{indexNamespace: vm.GetNamespace()}); err != nil {
		return nil
	}
	var out []reconcile.Request
	for _, pn := range list.Items {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&pn)})
	}
	return out
}

// Reconcile brings one PrivateNetwork's namespace, network and access to
// what it asks for, or deletes them once no VM uses them.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var pn v1alpha1.PrivateNetwork
	if err := r.Client.Get(ctx, req.NamespacedName, &pn); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	unfinalized := pn.DeepCopy()
	if pn.DeletionTimestamp.IsZero() && controllerutil.AddFinalizer(&pn, v1alpha1.FinalizerPrivateNetwork) {
		if err := r.Client.Patch(ctx, &pn, client.MergeFrom(unfinalized)); err != nil {
			return reconcile.Result{}, err
		}
	}
	before := pn.DeepCopy()
	ns, nsErr := tenantnet.Namespace(pn.Namespace, pn.Name)
	var vms []string
	if nsErr == nil {
		var err error
		if vms, err = vmsIn(ctx, r.Client, ns); err != nil {
			return reconcile.Result{}, err
		}
	}
	setInUse(&pn, vms)
	if !pn.DeletionTimestamp.IsZero() {
		return r.release(ctx, &pn, before, ns, vms)
	}
	ready := r.provision(ctx, &pn, ns, nsErr)
	if ready.err != nil && ready.reason == "" {
		return reconcile.Result{}, ready.err
	}
	status, message := metav1.ConditionTrue, ready.message
	if ready.err != nil {
		status, message = metav1.ConditionFalse, ready.err.Error()
	}
	setCondition(&pn, v1alpha1.ConditionReady, status, ready.reason, message)
	var again time.Duration
	if ready.reason == v1alpha1.ReasonQuotaPending {
		again = waitRequeue // the quota controller's copy to status.hard also wakes it
	}
	return reconcile.Result{RequeueAfter: again}, r.writeStatus(ctx, &pn, before)
}

// outcome is what provision made of a network: a reason and message for
// its Ready condition, or an error with no reason to retry with backoff.
type outcome struct {
	reason, message string
	err             error
}

func refused(reason string, err error) outcome { return outcome{reason: reason, err: err} }

func (r *Reconciler) provision(ctx context.Context, pn *v1alpha1.PrivateNetwork, ns string, nsErr error) outcome {
	subnet, err := tenantnet.ParseSubnet(pn.Spec.IPv4CIDR)
	if err != nil {
		return refused(v1alpha1.ReasonSubnetInvalid, err)
	}
	if other, err := r.olderOverlap(ctx, pn, subnet); err != nil {
		return outcome{err: err}
	} else if other != nil {
		return refused(v1alpha1.ReasonSubnetInvalid, fmt.Errorf("subnet %s overlaps %s of network %s, which was there first", subnet, other.Spec.IPv4CIDR, other.Name))
	}
	if nsErr != nil {
		return refused(v1alpha1.ReasonNameTooLong, nsErr)
	}
	var home corev1.Namespace
	if err := r.Client.Get(ctx, client.ObjectKey{Name: pn.Namespace}, &home); err != nil {
		return outcome{err: err}
	}
	if of, ok := home.Annotations[tenantnet.AnnotationNetworkOf]; ok {
		return refused(v1alpha1.ReasonNotHome, fmt.Errorf("namespace %s is the namespace of network %s: create networks in the tenant's own namespace", pn.Namespace, of))
	}
	if o := r.ensureNamespace(ctx, pn, &home, ns); o.err != nil {
		return o
	}
	pn.Status.Namespace = ns
	if o := r.ensureQuota(ctx, pn, ns); o.err != nil {
		return o
	}
	if err := r.ensureAccess(ctx, pn, ns); err != nil {
		return outcome{err: err}
	}
	return r.ensureUDN(ctx, ns, subnet)
}

// olderOverlap returns the tenant's network created before pn (by time,
// then name) whose subnet overlaps pn's, if any.
func (r *Reconciler) olderOverlap(ctx context.Context, pn *v1alpha1.PrivateNetwork, subnet netip.Prefix) (*v1alpha1.PrivateNetwork, error) {
	var list v1alpha1.PrivateNetworkList
	if err := r.Client.List(ctx, &list, client.InNamespace(pn.Namespace)); err != nil {
		return nil, err
	}
	for i := range list.Items {
		o := &list.Items[i]
		older := o.CreationTimestamp.Before(&pn.CreationTimestamp) ||
			(o.CreationTimestamp.Equal(&pn.CreationTimestamp) && o.Name < pn.Name)
		if o.Name == pn.Name || !older {
			continue
		}
		if q, err := netip.ParsePrefix(o.Spec.IPv4CIDR); err == nil && q.Overlaps(subnet) {
			return o, nil
		}
	}
	return nil, nil
}

func (r *Reconciler) ensureNamespace(ctx context.Context, pn *v1alpha1.PrivateNetwork, home *corev1.Namespace, ns string) outcome {
	owner := pn.Namespace + "/" + pn.Name
	var n corev1.Namespace
	err := r.Client.Get(ctx, client.ObjectKey{Name: ns}, &n)
	if apierrors.IsNotFound(err) {
		if why, err := r.Bounds.admitNetwork(ctx, r.live(), pn); err != nil {
			return outcome{err: err}
		} else if why != "" {
			return refused(v1alpha1.ReasonTenantLimit, errors.New(why))
		}
		n = corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
			Name:        ns,
			Labels:      map[string]string{tenantnet.LabelPrimaryUDN: "", tenantnet.LabelNetwork: pn.Name},
			Annotations: map[string]string{tenantnet.AnnotationNetworkOf: owner},
		}}
		if t := home.Annotations[AnnotationTenant]; t != "" {
			n.Annotations[AnnotationTenant] = t
		}
		if err := r.Client.Create(ctx, &n); err != nil {
			return outcome{err: err}
		}
		r.logger().Info("created the namespace of a private network", "network", owner, "namespace", ns)
		return outcome{}
	}
	if err != nil {
		return outcome{err: err}
	}
	if n.Annotations[tenantnet.AnnotationNetworkOf] != owner {
		return refused(v1alpha1.ReasonNamespaceUsed, fmt.Errorf("namespace %s exists and does not belong to this network; delete the network and choose another name", ns))
	}
	if _, ok := n.Labels[tenantnet.LabelPrimaryUDN]; !ok {
		return refused(v1alpha1.ReasonNamespaceUsed, fmt.Errorf("namespace %s lacks OVN-Kubernetes' label %s, which only its creation can set", ns, tenantnet.LabelPrimaryUDN))
	}
	if !n.DeletionTimestamp.IsZero() {
		return refused(v1alpha1.ReasonNamespaceUsed, fmt.Errorf("namespace %s is still being deleted", ns))
	}
	return outcome{}
}

// ensureAccess binds the tenant ClusterRole in ns to the subjects bound
// to it in the network's home namespace.
func (r *Reconciler) ensureAccess(ctx context.Context, pn *v1alpha1.PrivateNetwork, ns string) error {
	var bindings rbacv1.RoleBindingList
	if err := r.Client.List(ctx, &bindings, client.InNamespace(pn.Namespace)); err != nil {
		return err
	}
	var subjects []rbacv1.Subject
	for _, b := range bindings.Items {
		if b.RoleRef.Kind != "ClusterRole" || b.RoleRef.Name != r.TenantRole {
			continue
		}
		for _, s := range b.Subjects {
			if s.Kind == rbacv1.ServiceAccountKind && s.Namespace == "" {
				s.Namespace = pn.Namespace // a ServiceAccount of the home, as the binding meant
			}
			if !slices.Contains(subjects, s) {
				subjects = append(subjects, s)
			}
		}
	}
	slices.SortFunc(subjects, func(a, b rbacv1.Subject) int {
		return cmp.Or(strings.Compare(a.Kind, b.Kind), strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
	})
	want := rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: r.TenantRole, Namespace: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: r.TenantRole},
		Subjects:   subjects,
	}
	var have rbacv1.RoleBinding
	err := r.Client.Get(ctx, client.ObjectKeyFromObject(&want), &have)
	if apierrors.IsNotFound(err) {
		return r.Client.Create(ctx, &want)
	}
	if err != nil || equality.Semantic.DeepEqual(have.Subjects, want.Subjects) {
		return err
	}
	have.Subjects = want.Subjects
	return r.Client.Update(ctx, &have)
}

func (r *Reconciler) ensureUDN(ctx context.Context, ns string, subnet netip.Prefix) outcome {
	want := tenantnet.UDN(ns, subnet)
	have := &unstructured.Unstructured{}
	have.SetGroupVersionKind(tenantnet.UDNKind)
	err := r.Client.Get(ctx, client.ObjectKeyFromObject(want), have)
	switch {
	case meta.IsNoMatchError(err):
		return refused(v1alpha1.ReasonNetworkError, errors.New("this hub does not serve OVN-Kubernetes' UserDefinedNetworks (k8s.ovn.org/v1); its provider must install OVN-Kubernetes with user defined networks enabled"))
	case apierrors.IsNotFound(err):
		if err := r.Client.Create(ctx, want); err != nil {
			if apierrors.IsInvalid(err) {
				return refused(v1alpha1.ReasonNetworkError, fmt.Errorf("OVN-Kubernetes refused the network: %w", err))
			}
			return outcome{err: err}
		}
		have = want
	case err != nil:
		return outcome{err: err}
	}
	if !equality.Semantic.DeepEqual(have.Object["spec"], want.Object["spec"]) {
		return refused(v1alpha1.ReasonNetworkError, fmt.Errorf("UserDefinedNetwork %s/%s was changed by hand and is not this network's; delete it and the syncer makes it again", ns, tenantnet.UDNName))
	}
	// OVN-Kubernetes reports on the network in its NetworkCreated condition.
	conds, _, _ := unstructured.NestedSlice(have.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == "NetworkCreated" && m["status"] == "False" {
			return refused(v1alpha1.ReasonNetworkError, fmt.Errorf("OVN-Kubernetes has not created the network: %v", m["message"]))
		}
	}
	return outcome{reason: v1alpha1.ReasonProvisioned, message: fmt.Sprintf("namespace %s, layer-2 primary network on %s with persistent addresses", ns, subnet)}
}

// release runs while a network is being deleted: it waits for its VMs,
// then deletes its namespace, then lets the network go.
func (r *Reconciler) release(ctx context.Context, pn, before *v1alpha1.PrivateNetwork, ns string, vms []string) (reconcile.Result, error) {
	if len(vms) > 0 {
		setCondition(pn, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonVMsPresent,
			fmt.Sprintf("being deleted once no VM uses it; VMs on it: %s", strings.Join(pn.Status.VirtualMachines, ", ")))
		return reconcile.Result{}, r.writeStatus(ctx, pn, before)
	}
	if ns != "" {
		var n corev1.Namespace
		err := r.Client.Get(ctx, client.ObjectKey{Name: ns}, &n)
		if err != nil && !apierrors.IsNotFound(err) {
			return reconcile.Result{}, err
		}
		if err == nil && n.Annotations[tenantnet.AnnotationNetworkOf] == pn.Namespace+"/"+pn.Name {
			if n.DeletionTimestamp.IsZero() {
				if err := r.Client.Delete(ctx, &n); client.IgnoreNotFound(err) != nil {
					return reconcile.Result{}, err
				}
				r.logger().Info("deleting the namespace of a private network", "network", pn.Namespace+"/"+pn.Name, "namespace", ns)
			}
			return reconcile.Result{RequeueAfter: waitRequeue}, nil
		}
	}
	if err := r.releaseShare(ctx, pn); err != nil {
		return reconcile.Result{}, err
	}
	if controllerutil.RemoveFinalizer(pn, v1alpha1.FinalizerPrivateNetwork) {
		return reconcile.Result{}, client.IgnoreNotFound(r.Client.Patch(ctx, pn, client.MergeFrom(before)))
	}
	return reconcile.Result{}, nil
}

// vmsIn lists the names of the VirtualMachines in ns, sorted. A hub that
// serves no VirtualMachines has none.
func vmsIn(ctx context.Context, c client.Reader, ns string) ([]string, error) {
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(vmKind.GroupVersion().WithKind(vmKind.Kind + "List"))
	if err := c.List(ctx, list, client.InNamespace(ns)); err != nil {
		if meta.IsNoMatchError(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("listing the VMs in %s: %w", ns, err)
	}
	names := make([]string, 0, len(list.Items))
	for _, vm := range list.Items {
		names = append(names, vm.Name)
	}
	slices.Sort(names)
	return names, nil
}

func setInUse(pn *v1alpha1.PrivateNetwork, vms []string) {
	pn.Status.VirtualMachineCount = int32(len(vms))
	pn.Status.VirtualMachines = slices.Clone(vms[:min(len(vms), maxListedVMs)])
	if len(vms) == 0 {
		pn.Status.VirtualMachines = nil
		setCondition(pn, v1alpha1.ConditionInUse, metav1.ConditionFalse, v1alpha1.ReasonNoVMs, "no VM is on the network")
		return
	}
	setCondition(pn, v1alpha1.ConditionInUse, metav1.ConditionTrue, v1alpha1.ReasonVMsPresent, fmt.Sprintf("VMs on the network: %d", len(vms)))
}

func setCondition(pn *v1alpha1.PrivateNetwork, typ string, status metav1.ConditionStatus, reason, message string) {
	meta.SetStatusCondition(&pn.Status.Conditions, metav1.Condition{
		Type: typ, Status: status, Reason: reason, Message: message, ObservedGeneration: pn.Generation,
	})
}

// writeStatus patches pn's status when it differs from before's.
func (r *Reconciler) writeStatus(ctx context.Context, pn, before *v1alpha1.PrivateNetwork) error {
	pn.Status.ObservedGeneration = pn.Generation
	if equality.Semantic.DeepEqual(before.Status, pn.Status) {
		return nil
	}
	return client.IgnoreNotFound(r.Client.Status().Patch(ctx, pn, client.MergeFrom(before)))
}

func (r *Reconciler) logger() *slog.Logger {
	if r.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return r.Logger
}
