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

// KubeVirtConfig is what a cluster's KubeVirt configuration
// (spec.configuration of its KubeVirt object) says about what a VM may use:
// the network binding plugins it registers, its feature gates and the host
// devices it permits.
type KubeVirtConfig struct {
	// Known is false when the KubeVirt configuration could not be read
	// (the user may not read KubeVirt objects).
	Known bool
	// Source names the KubeVirt object read, for messages.
	Source string
	// Bindings are the network binding plugins registered in
	// network.binding, sorted. KubeVirt's own bindings (masquerade for the
	// pod network, bridge for Multus networks) need no registration.
	Bindings []string
	// LiveUpdate is whether vmRolloutStrategy is LiveUpdate: changes to a
	// VM's memory and instancetype reach its running instance.
	LiveUpdate bool
	// FeatureGates are developerConfiguration.featureGates, sorted.
	FeatureGates []string
	// PermittedDevices are the resource names of permittedHostDevices (PCI,
	// mediated and USB), sorted; DevicesListed is false when the
	// configuration has no permittedHostDevices at all.
	PermittedDevices []string
	DevicesListed    bool
}

// HasBinding reports whether the cluster registers the binding plugin name.
func (c KubeVirtConfig) HasBinding(name string) bool { return slices.Contains(c.Bindings, name) }

// ReadKubeVirtConfig reads the cluster's KubeVirt configuration. A cluster
// without KubeVirt registers and permits nothing; a user who may not read
// KubeVirt objects gets Known false, not an error.
func ReadKubeVirtConfig(ctx context.Context, c cdi.Reader) (KubeVirtConfig, error) {
	var list kubevirtv1.KubeVirtList
	if err := c.List(ctx, "", "", &list); err != nil {
		switch {
		case apierrors.IsForbidden(err):
			return KubeVirtConfig{}, nil
		case meta.IsNoMatchError(err) || apierrors.IsNotFound(err):
			return KubeVirtConfig{Known: true, Source: "no KubeVirt is installed"}, nil
		}
		return KubeVirtConfig{}, fmt.Errorf("reading KubeVirt's configuration: %w", err)
	}
	if len(list.Items) == 0 {
		return KubeVirtConfig{Known: true, Source: "no KubeVirt object exists"}, nil
	}
	// One KubeVirt runs a cluster; take the first in a stable order.
	slices.SortFunc(list.Items, func(a, b kubevirtv1.KubeVirt) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	kv := list.Items[0]
	cfg := kv.Spec.Configuration
	out := KubeVirtConfig{Known: true, Source: "KubeVirt " + kv.Namespace + "/" + kv.Name}
	out.LiveUpdate = cfg.VMRolloutStrategy != nil && *cfg.VMRolloutStrategy == kubevirtv1.VMRolloutStrategyLiveUpdate
	if n := cfg.NetworkConfiguration; n != nil {
		out.Bindings = slices.Sorted(maps.Keys(n.Binding))
	}
	if d := cfg.DeveloperConfiguration; d != nil {
		out.FeatureGates = slices.Sorted(slices.Values(d.FeatureGates))
	}
	if p := cfg.PermittedHostDevices; p != nil {
		out.DevicesListed = true
		for _, d := range p.PciHostDevices {
			out.PermittedDevices = append(out.PermittedDevices, d.ResourceName)
		}
		for _, d := range p.MediatedDevices {
			out.PermittedDevices = append(out.PermittedDevices, d.ResourceName)
		}
		for _, d := range p.USB {
			out.PermittedDevices = append(out.PermittedDevices, d.ResourceName)
		}
		slices.Sort(out.PermittedDevices)
	}
	return out, nil
}

// requireBinding checks that the cluster registers the binding plugin a
// VM on the namespace's primary network (what) needs, and refuses with a
// sentence naming the missing configuration otherwise. When the
// configuration could not be read, a default OpenShift Virtualization
// install is assumed, with a note.
func (b *vmBuild) requireBinding(name, what, howToRegister string) error {
	reg := b.req.KubeVirt
	if !reg.Known {
		if slices.Contains(defaultBindings, name) {
			b.out.Notes = append(b.out.Notes, fmt.Sprintf("could not read KubeVirt's registered network bindings; assuming %q is registered, as on a default OpenShift Virtualization install", name))
			return nil
		}
		return fmt.Errorf("%s needs KubeVirt's %q network binding, which a default OpenShift Virtualization install does not register, and KubeVirt's configuration could not be read to check (grant read access to kubevirts.kubevirt.io, config/tenant); %s", what, name, howToRegister)
	}
	if reg.HasBinding(name) {
		return nil
	}
	registered := "none"
	if len(reg.Bindings) > 0 {
		registered = strings.Join(reg.Bindings, ", ")
	}
	return fmt.Errorf("%s needs KubeVirt's %q network binding, which the cluster does not register (%s; spec.configuration.network.binding registers: %s); %s", what, name, reg.Source, registered, howToRegister)
}

// requireDevice checks that the cluster's KubeVirt lets a VM pass device
// (a resource name) through: the feature gate its kind needs is enabled,
// or virt-api refuses the VM, and the device is among the permitted host
// devices, or virt-controller refuses to start it ("is not permitted in
// permittedHostDevices configuration"). When the configuration could not
// be read, or lists no permitted devices at all (an external device plugin
// may provide them), a note says what was not checked.
func (b *vmBuild) requireDevice(dl deviceList, name, device string) error {
	kv := b.req.KubeVirt
	what := fmt.Sprintf("%s %s (%s)", dl.kind, name, device)
	if !kv.Known {
		b.out.Notes = append(b.out.Notes, fmt.Sprintf("could not read KubeVirt's configuration; not checked that it permits %s", what))
		return nil
	}
	if dl.gate != "" && !slices.Contains(kv.FeatureGates, dl.gate) {
		return fmt.Errorf("%s needs KubeVirt's %q feature gate, which %s does not enable (spec.configuration.developerConfiguration.featureGates: %s); a cluster admin enables it there", what, dl.gate, kv.Source, listOrNone(kv.FeatureGates))
	}
	if !kv.DevicesListed {
		b.out.Notes = append(b.out.Notes, fmt.Sprintf("%s lists no permittedHostDevices; %s must come from an external device plugin", kv.Source, what))
		return nil
	}
	if !slices.Contains(kv.PermittedDevices, device) {
		return fmt.Errorf("%s is not permitted by %s (spec.configuration.permittedHostDevices permits: %s); a cluster admin adds its resource name there", what, kv.Source, listOrNone(kv.PermittedDevices))
	}
	return nil
}

func listOrNone(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}
