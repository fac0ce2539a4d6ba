package syncer

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/imagepipe/imagepipe/pkg/api"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// TestStatusShowsAnImageOnEveryHub: `imagectl status` asks each hub of a
// tenant's kubeconfig, as the tenant. hub-a and hub-c run CDI's real
// controller and importer; hub-b runs none, so its import never ends. An
// image is shown Ready on one and Importing on the other, with exit 2;
// --wait returns once it is Ready on hub-a and on hub-c, whose syncer
// starts after the wait began; an image the gate refused shows its reason
// code, with exit 3.
func TestStatusShowsAnImageOnEveryHub(t *testing.T) {
	t.Parallel()
	hubA, hubB, hubC := startTestHub(t, "hub-a"), startAPIHub(t, "hub-b"), startTestHub(t, "hub-c")
	sa, sb, sc := harness.ReserveSyncer(t), harness.ReserveSyncer(t), harness.ReserveSyncer(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{
		Gate: testenv.ImageGate, NotifyURL: sa.WebhookURL, NotifyURLs: []string{sb.WebhookURL, sc.WebhookURL}, NotifyToken: webhookToken,
	})
	startSyncer(t, sa, hubA, reg.Host, "--poll-interval", "1h")
	startSyncer(t, sb, hubB, reg.Host, "--poll-interval", "1h")
	kubeconfig := tenantKubeconfig(t, "tenant-a", "acme", hubA, hubB, hubC)

	res := importImage(t, rawDisk(t, "status"), reg.Host+"/acme/rhel:1")
	hubA.waitReady(t, "acme", "rhel--1", res.Digest)
	hubB.baseImage(t, "acme", "rhel--1", "importing", func(b *v1alpha1.BaseImage) bool { return b.Status.Phase == v1alpha1.PhaseImporting })

	status := func(args ...string) (testenv.Result, []api.ImageOnHub) {
		r := testenv.RunImagectl(t, append([]string{"status", "--kubeconfig", kubeconfig}, args...)...)
		var rows []api.ImageOnHub
		if strings.Contains(strings.Join(args, " "), "-o json") {
			if err := json.Unmarshal([]byte(r.Stdout), &rows); err != nil {
				t.Fatalf("imagectl status %v: %v\n%s", args, err, r.Stdout)
			}
		}
		return r, rows
	}
	r, rows := status("acme/rhel:1", "--hubs", "hub-a,hub-b", "-o", "json")
	want := map[string]string{"hub-a": "Ready", "hub-b": "Importing"}
	if r.Code != 2 || len(rows) != 2 {
		t.Fatalf("status: exit %d, %d rows; want 2 and a row per hub\n%s%s", r.Code, len(rows), r.Stdout, r.Stderr)
	}
	for _, row := range rows {
		if row.Phase != want[row.Hub] || row.Image != "acme/rhel:1" || row.Namespace != "acme" || row.Since == "" {
			t.Errorf("row %+v; want phase %s on %s with the image, namespace and since when", row, want[row.Hub], row.Hub)
		}
		if row.Hub == "hub-a" && row.Digest != res.Digest {
			t.Errorf("hub-a serves %s; want the pushed %s", row.Digest, res.Digest)
		}
	}
	table, _ := status("acme/rhel:1", "--hubs", "hub-a,hub-b")
	if !strings.Contains(table.Stdout, "hub-a") || !strings.Contains(table.Stdout, "Importing") || !strings.Contains(table.Stdout, res.Digest[:19]) {
		t.Errorf("the table does not show both hubs:\n%s", table.Stdout)
	}
	if r, rows := status("acme/rhel:1", "--hubs", "hub-c", "-o", "json"); r.Code != 2 || rows[0].Phase != "NotSynced" {
		t.Fatalf("hub-c before its syncer: exit %d, %+v; want 2, NotSynced", r.Code, rows)
	}
	waited := make(chan testenv.Result, 1)
	go func() {
		waited <- testenv.RunImagectl(t, "status", "--kubeconfig", kubeconfig, "acme/rhel:1", "--hubs", "hub-a,hub-c", "--wait", "--timeout", "5m", "-o", "json")
	}()
	startSyncer(t, sc, hubC, reg.Host, "--poll-interval", "1h")
	r = <-waited
	var both []api.ImageOnHub
	if err := json.Unmarshal([]byte(r.Stdout), &both); r.Code != 0 || err != nil || len(both) != 2 || both[0].Phase != "Ready" || both[1].Phase != "Ready" {
		t.Errorf("--wait on hub-a and hub-c: exit %d, %+v (%v); want 0 once Ready on both\n%s", r.Code, both, err, r.Stderr)
	}
	if r, _ := status("acme/rhel:1", "--hubs", "hub-a,hub-b", "--wait", "--timeout", "3s"); r.Code != 2 {
		t.Errorf("--wait on both, hub-b never Ready: exit %d, want 2 after the timeout\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	if r, _ := status("acme/nothing:1", "-o", "json"); r.Code != 2 || !strings.Contains(r.Stdout, `"NotSynced"`) {
		t.Errorf("an image no hub has: exit %d, want 2 and NotSynced\n%s", r.Code, r.Stdout)
	}

	// An image the gate refuses: a qcow2 whose one data cluster is mapped
	// 8,192 times.
	tb := diskTar(t, amplifierQCOW2())
	pushCrafted(t, reg.Host+"/acme/evil:1", gzipBytes(tb), nil, digest.FromBytes(tb).String())
	hubA.baseImage(t, "acme", "evil--1", "rejected", func(b *v1alpha1.BaseImage) bool { return b.Status.Phase == v1alpha1.PhaseRejected })
	r, rows = status("acme/evil:1", "--hubs", "hub-a", "-o", "json")
	if r.Code != 3 || len(rows) != 1 || rows[0].Reason != "SharedCluster" || rows[0].Message == "" {
		t.Errorf("a rejected image: exit %d, rows %+v; want 3 and reason SharedCluster", r.Code, rows)
	}

	// Every synced image, with no image named.
	if r, rows := status("-o", "json"); r.Code != 0 || len(rows) < 3 {
		t.Errorf("listing: exit %d, %d rows; want 0 and the images of both hubs\n%s", r.Code, len(rows), r.Stdout)
	}
}

// tenantKubeconfig is one kubeconfig with a context per hub, named as the
// hub, for user in namespace ns there: a tenant's view of a multi-hub
// service.
func tenantKubeconfig(t *testing.T, user, ns string, hubs ...*testHub) string {
	t.Helper()
	merged := clientcmdapi.NewConfig()
	for _, h := range hubs {
		h.BindTenant(t, user, ns)
		cfg, err := clientcmd.LoadFromFile(h.UserKubeconfig(t, user))
		if err != nil {
			t.Fatal(err)
		}
		ctx := cfg.Contexts[cfg.CurrentContext]
		auth := user + "@" + h.Name
		merged.Clusters[ctx.Cluster] = cfg.Clusters[ctx.Cluster]
		merged.AuthInfos[auth] = cfg.AuthInfos[ctx.AuthInfo]
		merged.Contexts[h.Name] = &clientcmdapi.Context{Cluster: ctx.Cluster, AuthInfo: auth, Namespace: ns}
		merged.CurrentContext = h.Name
	}
	path := filepath.Join(t.TempDir(), "tenant.kubeconfig")
	if err := clientcmd.WriteToFile(*merged, path); err != nil {
		t.Fatal(err)
	}
	return path
}
