package hub

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/imagepipe/imagepipe/internal/cdi"
	"github.com/imagepipe/imagepipe/internal/hub"
	"github.com/imagepipe/imagepipe/internal/intake"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
	"github.com/imagepipe/imagepipe/test/harness"
)

// copyRequests counts the requests a client sends about the copies the
// syncer makes for CDI's importer (the tenant's pull Secret, the CA
// ConfigMap), by verb and kind ("get Secret").
type copyRequests struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *copyRequests) note(verb string, obj client.Object) {
	var kind string
	switch obj.(type) {
	case *corev1.Secret:
		kind = "Secret"
	case *corev1.ConfigMap:
		kind = "ConfigMap"
	default:
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[verb+" "+kind]++
}

// take returns the counts so far and starts again from none.
func (c *copyRequests) take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.n
	c.n = nil
	return n
}

// counting wraps c so that every Get, Create, Update, Patch and Delete of
// a Secret or ConfigMap is noted in reqs before it reaches the API server.
func counting(c client.WithWatch, reqs *copyRequests) client.WithWatch {
	return interceptor.NewClient(c, interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			reqs.note("get", obj)
			return c.Get(ctx, key, obj, opts...)
		},
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			reqs.note("create", obj)
			return c.Create(ctx, obj, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			reqs.note("update", obj)
			return c.Update(ctx, obj, opts...)
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			reqs.note("patch", obj)
			return c.Patch(ctx, obj, patch, opts...)
		},
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			reqs.note("delete", obj)
			return c.Delete(ctx, obj, opts...)
		},
	})
}

// TestAServedImageLeavesTheImportersCopiesAlone: the syncer copies the
// tenant's registry credential and the registry's CA into the tenant's
// namespace for an import, and no request about them follows once the
// BaseImage is Ready, however often it is looked at again (a recheck, an
// annotation, a DataVolume event). A credential changed since is copied
// for the next import.
func TestAServedImageLeavesTheImportersCopiesAlone(t *testing.T) {
	t.Parallel()
	cluster := harness.StartSyncerHub(t, "hub-a", harness.SyncerHubOptions{Namespaces: []string{"acme"}, NoCDI: true})
	reg, tenancy := applierParts(t)
	applier := &hub.Applier{Client: cluster.Client, Registry: reg, Tenancy: tenancy}
	credentials := t.TempDir()
	writeCredential := func(password string) {
		t.Helper()
		auth := base64.StdEncoding.EncodeToString([]byte("acme:" + password))
		config := fmt.Sprintf(`{"auths":{"registry.example.com":{"auth":%q}}}`, auth)
		if err := os.WriteFile(filepath.Join(credentials, "acme"), []byte(config), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeCredential("first")
	reqs := &copyRequests{}
	gate := &gateAnswers{}
	r := &hub.Reconciler{Client: counting(cluster.Client, reqs), Registry: reg, Verdicts: gate,
		TenantCredentials: hub.CredentialDir{Dir: credentials, Registry: "registry.example.com"},
		CA:                []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")}
	key := client.ObjectKey{Namespace: "acme", Name: cdi.BaseImageName("acme/rhel", "9")}
	image := cdi.ImageName("acme/rhel")

	// push has the tag point at digest, with the gate's verdict accepting
	// it, and reconciles until the import of digest is started and, CDI
	// played, has finished and is served.
	push := func(digest string) {
		t.Helper()
		gate.set(digest, accepted(""))
		if err := applier.Apply(t.Context(), intake.Event{Action: intake.ActionPush, Repository: "acme/rhel", Tag: "9", Digest: digest}); err != nil {
			t.Fatal(err)
		}
		reconcileBaseImage(t, r, key)
		var dv cdiv1.DataVolume
		if err := cluster.Client.Get(t.Context(), client.ObjectKey{Namespace: "acme", Name: cdi.DataVolumeName(image, digest)}, &dv); err != nil {
			t.Fatalf("the import of %s: %v", digest, err)
		}
		dv.Status.Phase = cdiv1.Succeeded
		if err := cluster.Client.Status().Update(t.Context(), &dv); err != nil {
			t.Fatal(err)
		}
		if bi := reconcileBaseImage(t, r, key); bi.Status.Phase != v1alpha1.PhaseReady || bi.Status.ImportedDigest != digest {
			t.Fatalf("after the import of %s: phase %s, imported %q; want Ready", digest, bi.Status.Phase, bi.Status.ImportedDigest)
		}
	}
	copied := func(password string) {
		t.Helper()
		var secret corev1.Secret
		if err := cluster.Client.Get(t.Context(), client.ObjectKey{Namespace: "acme", Name: cdi.PullSecretName}, &secret); err != nil {
			t.Fatal(err)
		}
		if got := string(secret.Data["secretKey"]); got != password {
			t.Errorf("the pull secret holds %q; want %q", got, password)
		}
		var cm corev1.ConfigMap
		if err := cluster.Client.Get(t.Context(), client.ObjectKey{Namespace: "acme", Name: cdi.CAConfigMapName}, &cm); err != nil {
			t.Fatal(err)
		}
		if cm.Data["ca.crt"] != string(r.CA) {
			t.Errorf("the CA ConfigMap holds %q", cm.Data["ca.crt"])
		}
	}

	push("sha256:" + strings.Repeat("a", 64))
	copied("first")
	if got := reqs.take(); got["create Secret"] != 1 || got["create ConfigMap"] != 1 {
		t.Errorf("the first import made %v; want the Secret and the ConfigMap created", got)
	}
	for range 3 {
		if bi := reconcileBaseImage(t, r, key); bi.Status.Phase != v1alpha1.PhaseReady {
			t.Fatalf("phase %s; want Ready", bi.Status.Phase)
		}
	}
	if got := reqs.take(); len(got) != 0 {
		t.Errorf("three looks at a Ready BaseImage sent %v about the importer's copies; want none", got)
	}

	writeCredential("second")
	push("sha256:" + strings.Repeat("b", 64))
	copied("second")
	if got := reqs.take(); got["update Secret"] != 1 || got["update ConfigMap"] != 0 {
		t.Errorf("the import after the credential changed made %v; want the Secret updated, the ConfigMap left", got)
	}
}

// reconcileBaseImage runs r on key until it asks for nothing sooner than
// a recheck, at most a few rounds, and returns the BaseImage as stored.
func reconcileBaseImage(t *testing.T, r *hub.Reconciler, key client.ObjectKey) *v1alpha1.BaseImage {
	t.Helper()
	for range 5 {
		res, err := r.Reconcile(quietContext(t), reconcile.Request{NamespacedName: key})
		if err != nil {
			t.Fatalf("reconciling %s: %v", key, err)
		}
		if res.RequeueAfter > 5*time.Second || res.RequeueAfter == 0 {
			break
		}
	}
	var bi v1alpha1.BaseImage
	if err := r.Client.Get(t.Context(), key, &bi); err != nil {
		t.Fatal(err)
	}
	return &bi
}
