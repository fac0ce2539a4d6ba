package vmlaunch

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/imagepipe/imagepipe/internal/cdi"
)

// Prepare completes req from the hub — the synced image imageRef
// (TENANT/IMAGE[:TAG]) in namespace req.ImageNamespace (default ns, where
// the VM goes), the root disk's storage from
// storageClass (the default class when empty), the namespace's primary
// network — and renders the VM. Nothing is created.
func Prepare(ctx context.Context, c cdi.Reader, ns, imageRef, storageClass string, req Request) (*Rendered, error) {
	req.Namespace = ns
	var err error
	if req.Image, err = FindImage(ctx, c, cmp.Or(req.ImageNamespace, ns), imageRef); err != nil {
		return nil, err
	}
	st, _, note, err := cdi.StorageForClass(ctx, c, storageClass)
	if err != nil {
		return nil, fmt.Errorf("choosing the root disk's storage: %w", err)
	}
	req.Storage, req.StorageNote = st, note
	if req.Network, err = PrimaryNetworkOf(ctx, c, ns); err != nil {
		return nil, err
	}
	if req.KubeVirt, err = ReadKubeVirtConfig(ctx, c); err != nil {
		return nil, err
	}
	r, err := Render(req)
	if err != nil {
		return nil, fmt.Errorf("template %s: %w", req.Template.ID, err)
	}
	if err := CheckLocalnets(ctx, c, ns, r.Localnets); err != nil {
		return nil, err
	}
	r.Notes = append(r.Notes, PreferenceNotes(ctx, c, r)...)
	return r, nil
}

var nadGVK = schema.GroupVersionKind{Group: "k8s.cni.cncf.io", Version: "v1", Kind: "NetworkAttachmentDefinition"}

// CheckLocalnets checks that the hub offers each localnet to namespace
// ns. OVN-Kubernetes writes, in each namespace a ClusterUserDefinedNetwork's
// namespace selector admits, a NetworkAttachmentDefinition of the network's
// name that it controls; tenants cannot write those. So a localnet is
// offered when that object is there, is controlled by the
// ClusterUserDefinedNetwork of the name, and configures a secondary
// localnet.
func CheckLocalnets(ctx context.Context, c cdi.Reader, ns string, names []string) error {
	for _, name := range names {
		nad := &unstructured.Unstructured{}
		nad.SetGroupVersionKind(nadGVK)
		err := c.Get(ctx, ns, name, nad)
		if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
			return fmt.Errorf("localnet %s is not offered to namespace %s: no provider network of that name selects it (the provider's ClusterUserDefinedNetwork %s, topology Localnet)", name, ns, name)
		}
		if err != nil {
			return fmt.Errorf("reading the attachment of localnet %s in %s: %w", name, ns, err)
		}
		owner := metav1.GetControllerOf(nad)
		if owner == nil || owner.Kind != "ClusterUserDefinedNetwork" || owner.Name != name || !strings.HasPrefix(owner.APIVersion, "k8s.ovn.org/") {
			return fmt.Errorf("localnet %s: the NetworkAttachmentDefinition %s/%s is not OVN-Kubernetes' for a ClusterUserDefinedNetwork of that name", name, ns, name)
		}
		config, _, _ := unstructured.NestedString(nad.Object, "spec", "config")
		var conf struct{ Topology, Role string }
		if err := json.Unmarshal([]byte(config), &conf); err != nil || conf.Topology != "localnet" || conf.Role != "secondary" {
			return fmt.Errorf("localnet %s: network %s is not a secondary localnet (topology %q, role %q)", name, name, conf.Topology, conf.Role)
		}
	}
	return nil
}

var clusterPreferenceGVK = schema.GroupVersionKind{Group: "instancetype.kubevirt.io", Version: "v1beta1", Kind: "VirtualMachineClusterPreference"}

// PreferenceNotes reads the cluster preference the rendered VM names, if
// any, and says what in it KubeVirt weighs in its live-migration verdict
// beyond what Render checks: Hyper-V reenlightenment (set by KubeVirt's
// common Windows preferences), with which KubeVirt live-migrates a VM only
// where the cluster exposes its nodes' TSC frequency. imagectl cannot see
// that from here, so its verdict stands, with the note. A preference the
// user may not read, or that does not exist (KubeVirt's admission then
// refuses the VM), gives no note.
func PreferenceNotes(ctx context.Context, c cdi.Reader, r *Rendered) []string {
	p := r.VM.Spec.Preference
	if p == nil || !r.LiveMigratable || (p.Kind != "" && p.Kind != clusterPreferenceGVK.Kind) {
		return nil
	}
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(clusterPreferenceGVK)
	if err := c.Get(ctx, "", p.Name, u); err != nil {
		return nil
	}
	if _, found, _ := unstructured.NestedFieldNoCopy(u.Object, "spec", "features", "preferredHyperv", "reenlightenment"); found {
		return []string{fmt.Sprintf("preference %s enables Hyper-V reenlightenment: KubeVirt live-migrates the VM only on a cluster that exposes its nodes' TSC frequency (KubeVirt's node labeller, invariant TSC); imagectl vm list shows KubeVirt's own verdict once the VM runs", p.Name)}
	}
	return nil
}
