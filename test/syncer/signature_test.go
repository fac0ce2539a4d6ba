package syncer

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	apimeta "k8s.io/apimachinery/pkg/api/meta"

	"github.com/imagepipe/imagepipe/internal/cdi"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// TestTenantSignaturesOnTheGate: tenant acme requires its images signed
// (a key file in the gate's --tenant-keys-dir, made by cosign
// generate-key-pair). An unsigned image is refused as Unsigned and one
// signed by tenant globex's key as UntrustedSignature, with nothing
// imported; once cosign sign --key signs it with acme's key, the hub
// imports it. imagectl import --sign-key makes an image Ready, and tenant
// initech, without a key file, needs no signature.
func TestTenantSignaturesOnTheGate(t *testing.T) {
	t.Parallel()
	testenv.RequireQEMU(t)
	cosign := harness.NewCosign(t)
	env := []string{"COSIGN_PASSWORD=" + harness.CosignPassword, "IMAGEPIPE_CACHE=" + t.TempDir()}
	keys := map[string]string{}
	policy := t.TempDir()
	for _, tenant := range []string{"acme", "globex"} {
		key, pub := cosign.KeyPair(t, filepath.Join(t.TempDir(), tenant))
		keys[tenant] = key
		data, err := os.ReadFile(pub)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(policy, tenant+".pub"), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	hub := &testHub{harness.StartSyncerHub(t, "hub-a", harness.SyncerHubOptions{Namespaces: []string{"acme", "globex", "initech"}})}
	s := harness.ReserveSyncer(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{
		Gate: testenv.ImageGate, GateArgs: []string{"--tenant-keys-dir", policy},
		NotifyURL: s.WebhookURL, NotifyToken: webhookToken,
	})
	startSyncer(t, s, hub, reg.Host, "--poll-interval", "1h")

	rejectedAs := func(reason string) func(*v1alpha1.BaseImage) bool {
		return func(b *v1alpha1.BaseImage) bool {
			c := apimeta.FindStatusCondition(b.Status.Conditions, v1alpha1.ConditionRejected)
			return b.Status.Phase == v1alpha1.PhaseRejected && c != nil && c.Status == "True" && c.Reason == reason
		}
	}
	unsigned := importImage(t, rawDisk(t, "unsigned"), reg.Host+"/acme/rhel:9")
	b := hub.baseImage(t, "acme", "rhel--9", "rejected as Unsigned", rejectedAs("Unsigned"))
	if c := apimeta.FindStatusCondition(b.Status.Conditions, v1alpha1.ConditionRejected); !strings.Contains(c.Message, "tenant acme requires images signed") {
		t.Errorf("the Unsigned condition says %q", c.Message)
	}
	ref := reg.Host + "/acme/rhel@" + unsigned.Digest
	cosign.Sign(t, keys["globex"], ref)
	hub.baseImage(t, "acme", "rhel--9", "rejected as UntrustedSignature", rejectedAs("UntrustedSignature"))
	if dvs := hub.dataVolumes(t, "acme", cdi.ImageName("acme/rhel")); len(dvs) != 0 {
		t.Errorf("an image no acme key signed has DataVolumes %v", dvs)
	}
	cosign.Sign(t, keys["acme"], ref)
	hub.waitReady(t, "acme", "rhel--9", unsigned.Digest)
	// imagectl inspect shows the tenant the key the gate found.
	_, gatePub := harness.ProviderKeyFiles(t)
	r := testenv.RunCommand(t, testenv.Command{Name: testenv.Imagectl, Args: []string{"inspect", "--gate-keys", gatePub, "docker://" + ref}})
	if r.Code != 0 || !strings.Contains(r.Stdout, "accepted by imagepipe-gate") || !strings.Contains(r.Stdout, "signed by") {
		t.Errorf("imagectl inspect of the signed image: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}

	r = testenv.RunCommand(t, testenv.Command{Name: testenv.Imagectl, Env: env,
		Args: []string{"import", "--quiet", "--sign-key", keys["acme"], rawDisk(t, "signed"), reg.Host + "/acme/signed:1"}})
	if r.Code != 0 {
		t.Fatalf("imagectl import --sign-key: exit %d\n%s", r.Code, r.Stderr)
	}
	hub.baseImage(t, "acme", "signed--1", "ready", func(b *v1alpha1.BaseImage) bool { return b.Status.Phase == v1alpha1.PhaseReady })

	// initech has no key file: it needs no signature.
	free := importImage(t, rawDisk(t, "free"), reg.Host+"/initech/rhel:1")
	hub.waitReady(t, "initech", "rhel--1", free.Digest)
}
