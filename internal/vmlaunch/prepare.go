package vmlaunch

import (
	"context"
	"fmt"

	"github.com/imagepipe/imagepipe/internal/cdi"
)

// Prepare completes req from the hub — the synced image imageRef
// (TENANT/IMAGE[:TAG]) in namespace ns, the root disk's storage from
// storageClass (the default class when empty), the namespace's primary
// network — and renders the VM. Nothing is created.
func Prepare(ctx context.Context, c cdi.Reader, ns, imageRef, storageClass string, req Request) (*Rendered, error) {
	req.Namespace = ns
	var err error
	if req.Image, err = FindImage(ctx, c, ns, imageRef); err != nil {
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
	return r, nil
}
