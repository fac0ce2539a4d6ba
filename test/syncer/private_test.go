package syncer

import (
	"encoding/base64"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/imagepipe/imagepipe/internal/cdi"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// TestSyncerWithAPrivateRegistryAndNoSharedStorage: the registry needs a
// password and serves TLS from a private CA, and the hub's only storage is
// ReadWriteOnce Filesystem. The syncer copies the tenant's credential and
// the CA into the tenant namespace for CDI, sizes the volume for the filesystem
// overhead, imports anyway and says VMs will not live-migrate. Two tags of
// one image get two DataSources, named like their BaseImages, with the image's hints.
func TestSyncerWithAPrivateRegistryAndNoSharedStorage(t *testing.T) {
	t.Parallel()
	testenv.RequireQEMU(t)
	fs := corev1.PersistentVolumeFilesystem
	hub := startTestHub(t, "hub-a", cdiv1.ClaimPropertySet{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, VolumeMode: &fs})
	s := harness.ReserveSyncer(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{Gate: testenv.ImageGate, Username: "robot", Password: "pull-only", TLS: true, NotifyURL: s.WebhookURL, NotifyToken: webhookToken})
	dockerConfig := filepath.Join(t.TempDir(), "config.json")
	auth := base64.StdEncoding.EncodeToString([]byte("robot:pull-only"))
	if err := os.WriteFile(dockerConfig, []byte(`{"auths":{"`+reg.Host+`":{"auth":"`+auth+`"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	// acme's own credential; this registry has one user, so it is the
	// syncer's too (test/syncer/tenants_test.go has one per tenant).
	tenantDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(tenantDir, "acme"), []byte(`{"auths":{"`+reg.Host+`":{"auth":"`+auth+`"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	// Not startSyncer: CDI's importer must verify the registry with the CA the syncer copies.
	s.Start(t, testenv.ImageSyncer, hub.SyncerHub, reg.Host, "--poll-interval", "1h", "--docker-config", dockerConfig, "--tenant-credentials-dir", tenantDir, "--registry-ca-file", reg.CAFile)

	hints := []string{"--username", "robot", "--password-stdin", "--ca-file", reg.CAFile, "--default-instancetype", "u1.medium", "--default-preference", "fedora"}
	v9 := importImageWith(t, "pull-only", rawDisk(t, "nine"), reg.Host+"/acme/rhel:9", hints...)
	bi := hub.baseImage(t, "acme", "rhel--9", "importing", func(b *v1alpha1.BaseImage) bool { return pickedUp(b) })
	c := meta.FindStatusCondition(bi.Status.Conditions, v1alpha1.ConditionLiveMigratable)
	if c == nil || c.Status != "False" || c.Reason != "NoReadWriteMany" {
		t.Errorf("LiveMigratable %+v, want False/NoReadWriteMany", c)
	}
	if bi.Status.Instancetype != "u1.medium" || bi.Status.Preference != "fedora" {
		t.Errorf("hints %q %q, want u1.medium and fedora", bi.Status.Instancetype, bi.Status.Preference)
	}

	dv := hub.dataVolumes(t, "acme", "rhel")[dvName(v9.Digest)]
	src := dv.Spec.Source.Registry
	if src == nil || src.SecretRef == nil || *src.SecretRef != cdi.PullSecretName || src.CertConfigMap == nil || *src.CertConfigMap != cdi.CAConfigMapName {
		t.Fatalf("DataVolume registry source %+v lacks the pull secret or CA", src)
	}
	var secret corev1.Secret
	if err := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: "acme", Name: cdi.PullSecretName}, &secret); err != nil {
		t.Fatal(err)
	}
	if string(secret.Data["accessKeyId"]) != "robot" || string(secret.Data["secretKey"]) != "pull-only" {
		t.Errorf("pull secret keys %v, want CDI's accessKeyId and secretKey with acme's credentials", slices.Sorted(maps.Keys(secret.Data)))
	}
	var cm corev1.ConfigMap
	if err := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: "acme", Name: cdi.CAConfigMapName}, &cm); err != nil {
		t.Fatal(err)
	}
	if ca, _ := os.ReadFile(reg.CAFile); cm.Data["ca.crt"] != string(ca) {
		t.Error("the CA ConfigMap does not hold the registry's CA")
	}
	st := dv.Spec.Storage
	size := st.Resources.Requests[corev1.ResourceStorage]
	if st.AccessModes[0] != corev1.ReadWriteOnce || *st.VolumeMode != corev1.PersistentVolumeFilesystem || size.Value() <= bi.Status.VirtualSize {
		t.Errorf("storage %v %v %s for a %d-byte disk: want RWO Filesystem with room for the filesystem", st.AccessModes, *st.VolumeMode, size.String(), bi.Status.VirtualSize)
	}

	v10 := importImageWith(t, "pull-only", rawDisk(t, "ten"), reg.Host+"/acme/rhel:10", hints...)
	hub.baseImage(t, "acme", "rhel--10", "importing", func(b *v1alpha1.BaseImage) bool { return pickedUp(b) })
	hub.CDI.WaitImported(t, "acme", dvName(v9.Digest), importTimeout)
	hub.baseImage(t, "acme", "rhel--9", "ready", func(b *v1alpha1.BaseImage) bool { return b.Status.DataSourceName == "rhel--9" })
	hub.CDI.WaitImported(t, "acme", dvName(v10.Digest), importTimeout)
	hub.baseImage(t, "acme", "rhel--10", "ready", func(b *v1alpha1.BaseImage) bool { return b.Status.DataSourceName == "rhel--10" })
	hub.wantDataSource(t, "acme", "rhel--9", dvName(v9.Digest))
	hub.wantDataSource(t, "acme", "rhel--10", dvName(v10.Digest))
	var ds cdiv1.DataSource
	if err := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: "acme", Name: "rhel--10"}, &ds); err != nil {
		t.Fatal(err)
	}
	if ds.Labels["instancetype.kubevirt.io/default-instancetype"] != "u1.medium" || ds.Labels["instancetype.kubevirt.io/default-preference"] != "fedora" {
		t.Errorf("DataSource labels %v lack the image's hints", ds.Labels)
	}
}
