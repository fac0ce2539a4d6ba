package syncer

import (
	"encoding/base64"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/imagepipe/imagepipe/internal/cdi"
	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// TestTenantPullSecretReadsOnlyItsTenant: a zot registry with
// per-repository access control gives acme and globex a read-only
// credential each for their own repositories, and the syncer one that reads
// everything. The syncer copies each tenant's own credential into its
// namespace, never its own: the Secret found in globex's namespace reads
// globex's image and is refused acme's, and the other way round.
func TestTenantPullSecretReadsOnlyItsTenant(t *testing.T) {
	t.Parallel()
	testenv.RequireQEMU(t)
	hub := startTestHub(t, "hub-a")
	all := []string{"read", "create", "update", "delete"}
	z := harness.StartZot(t, harness.ZotOptions{
		Users: map[string]string{"syncer": "syncer-pw", "pusher": "pusher-pw", "gate": "gate-pw", "acme-pull": "acme-pw", "globex-pull": "globex-pw"},
		Access: map[string]map[string][]string{
			"acme/**":   {"acme-pull": {"read"}, "pusher": all, "gate": all},
			"globex/**": {"globex-pull": {"read"}, "pusher": all, "gate": all},
			"**":        {"gate": {"read"}},
		},
		Admins: []string{"syncer"}, AdminActions: []string{"read"},
	})
	dir := t.TempDir()
	dockerConfig := func(path, user, pass string) string {
		auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))
		if err := os.WriteFile(path, []byte(`{"auths":{"`+z.Host+`":{"auth":"`+auth+`"}}}`), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	tenants := filepath.Join(dir, "tenants")
	if err := os.Mkdir(tenants, 0o700); err != nil {
		t.Fatal(err)
	}
	dockerConfig(filepath.Join(tenants, "acme"), "acme-pull", "acme-pw")
	dockerConfig(filepath.Join(tenants, "globex"), "globex-pull", "globex-pw")
	// The gate polls zot with an account of its own that reads and writes
	// the tenants' repositories; zot serves the referrers API, so its
	// verdicts are found through it rather than the referrers tag.
	harness.ReserveGate(t).Start(t, testenv.ImageGate, z.Host, "", "gate", "gate-pw", "--webhook-listen", "")
	s := harness.ReserveSyncer(t)
	startSyncer(t, s, hub, z.Host, "--webhook-listen", "", "--poll-interval", "1s", "--digest-resync-interval", "1s",
		"--docker-config", dockerConfig(filepath.Join(dir, "syncer.json"), "syncer", "syncer-pw"), "--tenant-credentials-dir", tenants)

	// zot answers a missing tag with the registry's own error, which is
	// what confirms a delete (registry.Client.Resolve).
	rc, err := registry.New(registry.WithCacheDir(""), registry.WithBasicAuth("syncer", "syncer-pw"))
	if err != nil {
		t.Fatal(err)
	}
	confirmMissing := func(ref string) {
		t.Helper()
		tag, err := name.NewTag(ref)
		if err != nil {
			t.Fatal(err)
		}
		if _, found, err := rc.Resolve(t.Context(), tag); found || err != nil {
			t.Errorf("zot's answer for %s: found %v, error %v; want a confirmed not found", ref, found, err)
		}
	}
	confirmMissing(z.Host + "/acme/none:missing") // NAME_UNKNOWN

	push := []string{"--username", "pusher", "--password-stdin"}
	importImageWith(t, "pusher-pw", rawDisk(t, "acme's secret disk"), z.Host+"/acme/rhel:9", push...)
	importImageWith(t, "pusher-pw", rawDisk(t, "globex's disk"), z.Host+"/globex/rhel:9", push...)
	confirmMissing(z.Host + "/acme/rhel:missing") // MANIFEST_UNKNOWN
	for _, ns := range []string{"acme", "globex"} {
		hub.baseImage(t, ns, "rhel--9", "importing", func(b *v1alpha1.BaseImage) bool { return pickedUp(b) })
	}

	for _, tc := range []struct{ ns, own, other string }{{"globex", "globex", "acme"}, {"acme", "acme", "globex"}} {
		var secret corev1.Secret
		if err := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: tc.ns, Name: cdi.PullSecretName}, &secret); err != nil {
			t.Fatalf("the pull secret in %s: %v", tc.ns, err)
		}
		found := &authn.Basic{Username: string(secret.Data["accessKeyId"]), Password: string(secret.Data["secretKey"])}
		if found.Username == "syncer" {
			t.Fatalf("the syncer's own credential was copied into %s", tc.ns)
		}
		// Its own image: the manifest and the layer, as CDI's importer reads them.
		img, err := remote.Image(ref(t, z.Host+"/"+tc.own+"/rhel:9"), remote.WithAuth(found), remote.WithContext(t.Context()))
		if err != nil {
			t.Fatalf("%s's secret cannot read %s/rhel:9: %v", tc.ns, tc.own, err)
		}
		layers, err := img.Layers()
		if err != nil || len(layers) != 1 {
			t.Fatalf("%s/rhel:9 layers: %v %v", tc.own, layers, err)
		}
		rc, err := layers[0].Compressed()
		if err != nil {
			t.Fatalf("%s's secret cannot read the layer of %s/rhel:9: %v", tc.ns, tc.own, err)
		}
		rc.Close()
		// The other tenant's image: refused.
		_, err = remote.Get(ref(t, z.Host+"/"+tc.other+"/rhel:9"), remote.WithAuth(found), remote.WithContext(t.Context()))
		var terr *transport.Error
		if !errors.As(err, &terr) || (terr.StatusCode != http.StatusUnauthorized && terr.StatusCode != http.StatusForbidden) {
			t.Errorf("%s's secret reading %s/rhel:9: %v; want 401 or 403", tc.ns, tc.other, err)
		}
		dvs := hub.dataVolumes(t, tc.ns, "rhel")
		if len(dvs) != 1 {
			t.Fatalf("%s: DataVolumes %v, want one", tc.ns, dvs)
		}
		for _, dv := range dvs {
			if ref := dv.Spec.Source.Registry.SecretRef; ref == nil || *ref != cdi.PullSecretName {
				t.Errorf("%s: DataVolume %s does not use the tenant's pull secret", tc.ns, dv.Name)
			}
		}
	}
}

func ref(t *testing.T, s string) name.Reference {
	t.Helper()
	r, err := name.ParseReference(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
