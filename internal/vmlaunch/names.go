package vmlaunch

import (
	"context"
	"fmt"
	"slices"
	"strings"

	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/imagepipe/imagepipe/internal/cdi"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
)

// The listings below name what a tenant may type after an imagectl vm or
// volume command, for shell completion: each is one list request.

// VMNames returns the names of the VMs in ns, sorted.
func VMNames(ctx context.Context, c cdi.Reader, ns string) ([]string, error) {
	var list kubevirtv1.VirtualMachineList
	if err := c.List(ctx, ns, "", &list); err != nil {
		return nil, fmt.Errorf("listing VMs in %s: %w", ns, err)
	}
	names := make([]string, 0, len(list.Items))
	for _, vm := range list.Items {
		names = append(names, vm.Name)
	}
	slices.Sort(names)
	return names, nil
}

// AttachedVolumes returns the data volumes attached to VM ns/name, root
// disk excluded.
func AttachedVolumes(ctx context.Context, c cdi.Reader, ns, name string) ([]string, error) {
	vm, err := getVM(ctx, c, ns, name)
	if err != nil {
		return nil, err
	}
	return dataVolumes(vm), nil
}

// ImageRefs returns the images VMs in ns can boot from now, as vm create
// --image takes them (TENANT/IMAGE:TAG), sorted: those whose BaseImage
// image-syncer has imported and FindImage would resolve. Images not yet
// imported, rejected or removed are left out.
func ImageRefs(ctx context.Context, c cdi.Reader, ns string) ([]string, error) {
	var list v1alpha1.BaseImageList
	if err := c.List(ctx, ns, "", &list); err != nil {
		return nil, fmt.Errorf("listing the synced images of %s: %w", ns, err)
	}
	var refs []string
	for _, bi := range list.Items {
		if bi.Status.ImportedDigest == "" || bi.Status.DataSourceName == "" {
			continue
		}
		// spec.repository is REGISTRY/TENANT/PATH; the ref names TENANT/PATH.
		_, repo, ok := strings.Cut(bi.Spec.Repository, "/")
		if !ok {
			continue
		}
		ref := repo + ":" + bi.Spec.Tag
		tenant, parsed, tag, err := ParseImageRef(ref)
		if err != nil || tenant != bi.Spec.Tenant || cdi.BaseImageName(parsed, tag) != bi.Name {
			continue // FindImage would not find it under this ref
		}
		refs = append(refs, ref)
	}
	slices.Sort(refs)
	return refs, nil
}
