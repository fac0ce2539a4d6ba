package netsync

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/imagepipe/imagepipe/internal/tenantnet"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
)

// Default bounds of what one tenant holds on a hub.
const (
	DefaultMaxNetworks      = 8
	DefaultMaxLoadBalancers = 16
	DefaultMaxExposedPorts  = 64
)

// Bounds are what one tenant may hold on a hub, over all of its
// namespaces. They bound what the hub shares between tenants: namespaces,
// external addresses, and NodePorts when the provider allocates them. The
// syncer is the only writer of what they bound, so they hold whichever
// client wrote the PrivateNetworks and LoadBalancers. What holds a
// namespace or a Service keeps it; an object past a bound gets nothing,
// says which bound, and waits: the first reconciled after a holder goes
// takes its place. A zero field means no bound.
type Bounds struct {
	Networks      int // private networks
	LoadBalancers int // load balancers
	ExposedPorts  int // ports, summed over the tenant's load balancers
}

// DefaultBounds are the bounds of a hub whose provider set none.
var DefaultBounds = Bounds{Networks: DefaultMaxNetworks, LoadBalancers: DefaultMaxLoadBalancers, ExposedPorts: DefaultMaxExposedPorts}

// tenantOf is the tenant's home namespace of namespace ns: the home its
// network annotation names, or ns itself.
func tenantOf(ns *corev1.Namespace) string {
	if home, _, ok := tenantnet.NetworkOf(ns.Annotations); ok {
		return home
	}
	return ns.Name
}

// balancersOfTenant lists the load balancers of the tenant whose home is
// home.
func balancersOfTenant(ctx context.Context, c client.Reader, home string) ([]v1alpha1.LoadBalancer, error) {
	var list v1alpha1.LoadBalancerList
	if err := c.List(ctx, &list); err != nil {
		return nil, err
	}
	homes := homesOf(ctx, c)
	var out []v1alpha1.LoadBalancer
	for _, lb := range list.Items {
		if homes(lb.Namespace) == home {
			out = append(out, lb)
		}
	}
	return out, nil
}

// homesOf returns the tenant's home of a namespace, read once each; ""
// when the namespace cannot be read.
func homesOf(ctx context.Context, c client.Reader) func(string) string {
	homes := map[string]string{}
	return func(name string) string {
		h, ok := homes[name]
		if !ok {
			var ns corev1.Namespace
			if c.Get(ctx, client.ObjectKey{Name: name}, &ns) == nil {
				h = tenantOf(&ns)
			}
			homes[name] = h
		}
		return h
	}
}

// admitLoadBalancer says why lb, of the tenant whose home is home, may
// not hold a Service: the Services the tenant's other load balancers hold
// take its bounds. "" admits it. The Services held are listed with counts:
// the API server itself when lb asks for a Service, so that one just
// created for another counts at once (the syncer reconciles one load
// balancer at a time); the rest is read from cached. A Service whose load
// balancer is gone or going (its garbage collection pending) holds
// nothing.
func (b Bounds) admitLoadBalancer(ctx context.Context, cached, counts client.Reader, lb *v1alpha1.LoadBalancer, home string) (string, error) {
	if b.LoadBalancers == 0 && b.ExposedPorts == 0 {
		return "", nil
	}
	var list corev1.ServiceList
	if err := counts.List(ctx, &list, client.HasLabels{LabelLoadBalancer}); err != nil {
		return "", err
	}
	homes := homesOf(ctx, cached)
	held, ports := 0, 0
	for _, svc := range list.Items {
		owner := metav1.GetControllerOf(&svc)
		if owner == nil || owner.Kind != "LoadBalancer" || (svc.Namespace == lb.Namespace && owner.Name == lb.Name) || homes(svc.Namespace) != home {
			continue
		}
		var o v1alpha1.LoadBalancer
		if err := cached.Get(ctx, client.ObjectKey{Namespace: svc.Namespace, Name: owner.Name}, &o); err != nil || o.UID != owner.UID || !o.DeletionTimestamp.IsZero() {
			continue
		}
		held++
		ports += len(svc.Spec.Ports)
	}
	switch {
	case b.LoadBalancers > 0 && held >= b.LoadBalancers:
		return fmt.Sprintf("tenant %s has %d other load balancers with a Service on this hub, the most one tenant may have (image-syncer --max-load-balancers-per-tenant=%d); delete one to expose this one", home, held, b.LoadBalancers), nil
	case b.ExposedPorts > 0 && ports+len(lb.Spec.Ports) > b.ExposedPorts:
		return fmt.Sprintf("tenant %s exposes %d ports with its other load balancers and this one asks for %d more; one tenant may expose at most %d on this hub (image-syncer --max-exposed-ports-per-tenant)", home, ports, len(lb.Spec.Ports), b.ExposedPorts), nil
	}
	return "", nil
}

// admitNetwork says why pn may not get its namespace: the namespaces of
// the tenant's other networks take its bound. "" admits it. Namespaces are
// read from live, the API server itself, so that one just created counts
// at once (the syncer reconciles one network at a time); one being
// deleted still counts.
func (b Bounds) admitNetwork(ctx context.Context, live client.Reader, pn *v1alpha1.PrivateNetwork) (string, error) {
	if b.Networks == 0 {
		return "", nil
	}
	var list metav1.PartialObjectMetadataList
	list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("NamespaceList"))
	if err := live.List(ctx, &list, client.HasLabels{tenantnet.LabelNetwork}); err != nil {
		return "", err
	}
	n := 0
	for _, ns := range list.Items {
		if home, name, ok := tenantnet.NetworkOf(ns.Annotations); ok && home == pn.Namespace && name != pn.Name {
			n++
		}
	}
	if n >= b.Networks {
		return fmt.Sprintf("tenant %s has %d other private networks on this hub, the most one tenant may have (image-syncer --max-networks-per-tenant=%d); delete one to make this one", pn.Namespace, n, b.Networks), nil
	}
	return "", nil
}

// requestsOf turns objects into reconcile requests.
func requestsOf[T any, P interface {
	*T
	client.Object
}](items []T) []reconcile.Request {
	out := make([]reconcile.Request, 0, len(items))
	for i := range items {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(P(&items[i]))})
	}
	return out
}
