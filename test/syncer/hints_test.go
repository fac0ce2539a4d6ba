package syncer

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/imagepipe/imagepipe/internal/hub"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// TestThePreferenceTableConfigMap: image-syncer, as the hub user bound to
// config/syncer's RBAC, reads the provider's preference table from the
// ConfigMap --preference-table names and starts; it does not start, and
// says why, when that ConfigMap is missing or is not a table.
func TestThePreferenceTableConfigMap(t *testing.T) {
	t.Parallel()
	h := startAPIHub(t, "hub-a")
	for name, table := range map[string]string{
		"preferences": "# the provider's\nrhel 9 = rhel.9\nwindows = windows.2k22\n",
		"broken":      "rhel 9 = RHEL 9\n",
	} {
		h.Create(t, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: harness.SyncerNamespace, Name: name},
			Data: map[string]string{hub.PreferenceTableKey: table}})
	}
	_, gateKeys := harness.ProviderKeyFiles(t)
	for _, tc := range []struct{ table, says string }{
		{harness.SyncerNamespace + "/broken", "the preference table is not valid: ConfigMap imagepipe-system/broken: line 1"},
		{harness.SyncerNamespace + "/missing", "not found"},
		{"missing", "want NAMESPACE/NAME"},
	} {
		r := testenv.RunCommand(t, testenv.Command{Name: testenv.ImageSyncer, Args: []string{
			"--kubeconfig", h.UserKubeconfig(t, "syncer"), "--registry", "127.0.0.1:1", "--gate-keys", gateKeys,
			"--webhook-listen", "", "--metrics-listen", "0", "--health-listen", "0", "--leader-election-namespace", harness.SyncerNamespace,
			"--preference-table", tc.table,
		}})
		if r.Code == 0 || !strings.Contains(r.Stderr, tc.says) {
			t.Errorf("--preference-table %s: exit %d, want a failure saying %q:\n%s", tc.table, r.Code, tc.says, r.Stderr)
		}
	}
	reg := harness.StartRegistry(t, harness.RegistryOptions{})
	s := harness.ReserveSyncer(t)
	startSyncer(t, s, h, reg.Host, "--preference-table", harness.SyncerNamespace+"/preferences")
}
