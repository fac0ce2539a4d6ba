package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
)

// Client reads and writes typed objects of the kinds registered in its
// scheme, and unstructured objects that carry their own kind. Resources
// are found through the API server's discovery, once per Client.
type Client struct {
	dyn    dynamic.Interface
	scheme *runtime.Scheme
	mapper meta.RESTMapper
}

// New returns a Client for the API server of cfg. Nothing is requested
// until the first call.
func New(cfg *rest.Config, scheme *runtime.Scheme) (*Client, error) {
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("building a client for %s: %w", cfg.Host, err)
	}
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("building a discovery client for %s: %w", cfg.Host, err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc))
	return &Client{dyn: dyn, scheme: scheme, mapper: mapper}, nil
}

// Get reads the object namespace/name into obj (namespace empty for a
// cluster-scoped kind). Errors keep the API server's status, so
// apierrors.IsNotFound and the like work on them.
func (c *Client) Get(ctx context.Context, namespace, name string, obj runtime.Object) error {
	ri, err := c.resource(obj, namespace, false)
	if err != nil {
		return err
	}
	u, err := ri.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	return c.decode(u.Object, obj)
}

// List reads the objects of list's kind in namespace (all namespaces, or
// a cluster-scoped kind, when empty) that match the label selector (all
// when empty) into list, a typed list or an UnstructuredList with its
// kind set.
func (c *Client) List(ctx context.Context, namespace, selector string, list runtime.Object) error {
	ri, err := c.resource(list, namespace, true)
	if err != nil {
		return err
	}
	ul, err := ri.List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return err
	}
	return c.decode(ul.UnstructuredContent(), list)
}

// Create creates obj in its namespace and reads the created object back
// into it (its generated name, UID and defaults).
func (c *Client) Create(ctx context.Context, obj runtime.Object) error {
	u, ri, err := c.encode(obj)
	if err != nil {
		return err
	}
	created, err := ri.Create(ctx, u, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	return c.decode(created.Object, obj)
}

// MergePatch sends the JSON merge patch that turns before into after (the
// same object, before and after the caller's edits) and reads the result
// into after. Only the fields the caller changed are sent, so concurrent
// changes to other fields are kept.
func (c *Client) MergePatch(ctx context.Context, before, after runtime.Object) error {
	from, err := json.Marshal(before)
	if err != nil {
		return err
	}
	to, err := json.Marshal(after)
	if err != nil {
		return err
	}
	patch, err := jsonpatch.CreateMergePatch(from, to)
	if err != nil {
		return fmt.Errorf("computing the merge patch: %w", err)
	}
	u, ri, err := c.encode(after)
	if err != nil {
		return err
	}
	patched, err := ri.Patch(ctx, u.GetName(), types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil {
		return err
	}
	return c.decode(patched.Object, after)
}

// Delete deletes obj; with foreground set, the API server deletes the
// objects it owns first (a VM's DataVolume templates).
func (c *Client) Delete(ctx context.Context, obj runtime.Object, foreground bool) error {
	u, ri, err := c.encode(obj)
	if err != nil {
		return err
	}
	opts := metav1.DeleteOptions{}
	if foreground {
		policy := metav1.DeletePropagationForeground
		opts.PropagationPolicy = &policy
	}
	return ri.Delete(ctx, u.GetName(), opts)
}

// kindOf returns obj's kind: its own for unstructured objects, else the
// one registered in the scheme. A list's kind is its item's.
func (c *Client) kindOf(obj runtime.Object, list bool) (schema.GroupVersionKind, error) {
	gvk := obj.GetObjectKind().GroupVersionKind()
	if _, ok := obj.(runtime.Unstructured); !ok || gvk.Empty() {
		kinds, _, err := c.scheme.ObjectKinds(obj)
		if err != nil {
			return gvk, fmt.Errorf("finding the kind of %T: %w", obj, err)
		}
		gvk = kinds[0]
	}
	if list {
		gvk.Kind = strings.TrimSuffix(gvk.Kind, "List")
	}
	return gvk, nil
}

// resource returns the dynamic client of obj's resource, in namespace
// when the resource is namespaced.
func (c *Client) resource(obj runtime.Object, namespace string, list bool) (dynamic.ResourceInterface, error) {
	gvk, err := c.kindOf(obj, list)
	if err != nil {
		return nil, err
	}
	m, err := c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, err
	}
	nri := c.dyn.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace && namespace != "" {
		return nri.Namespace(namespace), nil
	}
	return nri, nil
}

// encode turns obj into an unstructured object with its kind set, and
// returns the client of its resource in its namespace.
func (c *Client) encode(obj runtime.Object) (*unstructured.Unstructured, dynamic.ResourceInterface, error) {
	content, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, nil, fmt.Errorf("encoding %T: %w", obj, err)
	}
	u := &unstructured.Unstructured{Object: content}
	gvk, err := c.kindOf(obj, false)
	if err != nil {
		return nil, nil, err
	}
	u.SetGroupVersionKind(gvk)
	ri, err := c.resource(u, u.GetNamespace(), false)
	if err != nil {
		return nil, nil, err
	}
	return u, ri, nil
}

// decode fills obj from an object read from the API server.
func (c *Client) decode(content map[string]any, obj runtime.Object) error {
	if u, ok := obj.(runtime.Unstructured); ok {
		u.SetUnstructuredContent(content)
		return nil
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(content, obj); err != nil {
		return fmt.Errorf("decoding %T: %w", obj, err)
	}
	return nil
}
