package vmlaunch

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/imagepipe/imagepipe/internal/cdi"
)

// Network binding plugins a VM on a primary user defined network needs.
const (
	// BindingL2Bridge plugs a VM into a layer-2 primary UDN, where
	// OVN-Kubernetes keeps its address across nodes: live-migratable.
	BindingL2Bridge = "l2bridge"
	// BindingPasst plugs a VM into a layer-3 primary UDN, where its
	// address changes with its node: not live-migratable.
	BindingPasst = "passt"
)

// defaultBindings is what a default OpenShift Virtualization install
// registers, assumed when the KubeVirt configuration cannot be read.
// Vanilla KubeVirt registers none.
var defaultBindings = []string{BindingL2Bridge}

// NetworkBindings are the network binding plugins a cluster's KubeVirt
// registers in spec.configuration.network.binding. KubeVirt's own
// bindings (masquerade for the pod network, bridge for Multus networks)
// need no registration.
type NetworkBindings struct {
	// Known is false when the KubeVirt configuration could not be read
	// (the user may not read KubeVirt objects).
	Known bool
	// Names are the registered plugins, sorted.
	Names []string
	// Source names the KubeVirt object read, for messages.
	Source string
}

// Has reports whether the cluster registers the binding plugin name.
func (b NetworkBindings) Has(name string) bool { return slices.Contains(b.Names, name) }

// RegisteredBindings reads the network bindings the cluster's KubeVirt
// registers. A cluster without KubeVirt registers none; a user who may
// not read KubeVirt objects gets Known false, not an error.
func RegisteredBindings(ctx context.Context, c cdi.Reader) (NetworkBindings, error) {
	var list kubevirtv1.KubeVirtList
	if err := c.List(ctx, "", "", &list); err != nil {
		switch {
		case apierrors.IsForbidden(err):
			return NetworkBindings{}, nil
		case meta.IsNoMatchError(err) || apierrors.IsNotFound(err):
			return NetworkBindings{Known: true, Source: "no KubeVirt is installed"}, nil
		}
		return NetworkBindings{}, fmt.Errorf("reading KubeVirt's network bindings: %w", err)
	}
	if len(list.Items) == 0 {
		return NetworkBindings{Known: true, Source: "no KubeVirt object exists"}, nil
	}
	// One KubeVirt runs a cluster; take the first in a stable order.
	slices.SortFunc(list.Items, func(a, b kubevirtv1.KubeVirt) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	kv := list.Items[0]
	out := NetworkBindings{Known: true, Source: "KubeVirt " + kv.Namespace + "/" + kv.Name}
	if cfg := kv.Spec.Configuration.NetworkConfiguration; cfg != nil {
		out.Names = slices.Sorted(maps.Keys(cfg.Binding))
	}
	return out, nil
}

// requireBinding checks that the cluster registers the binding plugin a
// VM on the namespace's primary network (what) needs, and refuses with a
// sentence naming the missing configuration otherwise. When the
// configuration could not be read, a default OpenShift Virtualization
// install is assumed, with a note.
func (b *vmBuild) requireBinding(name, what, howToRegister string) error {
	reg := b.req.Bindings
	if !reg.Known {
		if slices.Contains(defaultBindings, name) {
			b.out.Notes = append(b.out.Notes, fmt.Sprintf("could not read KubeVirt's registered network bindings; assuming %q is registered, as on a default OpenShift Virtualization install", name))
			return nil
		}
		return fmt.Errorf("%s needs KubeVirt's %q network binding, which a default OpenShift Virtualization install does not register, and KubeVirt's configuration could not be read to check (grant read access to kubevirts.kubevirt.io, config/tenant); %s", what, name, howToRegister)
	}
	if reg.Has(name) {
		return nil
	}
	registered := "none"
	if len(reg.Names) > 0 {
		registered = strings.Join(reg.Names, ", ")
	}
	return fmt.Errorf("%s needs KubeVirt's %q network binding, which the cluster does not register (%s; spec.configuration.network.binding registers: %s); %s", what, name, reg.Source, registered, howToRegister)
}
