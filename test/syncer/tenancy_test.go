package syncer

import (
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/imagepipe/imagepipe/internal/cdi"
	"github.com/imagepipe/imagepipe/internal/hub"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// TestNamespaceKeepsItsFirstTenantAcrossRestarts: a namespace template
// folds the registry project eu-globex into globex's namespace, which no
// start-up probe can tell from a template that keeps tenants apart. globex
// reaches the namespace first: the syncer records it on the Namespace and
// never acts there for eu-globex, neither before a restart nor after one,
// when the catalog lists eu-globex first and one worker takes its event
// before globex's. A BaseImage of eu-globex found in the namespace is not
// imported; it says why, naming both tenants.
func TestNamespaceKeepsItsFirstTenantAcrossRestarts(t *testing.T) {
	t.Parallel()
	testenv.RequireQEMU(t)
	h := startTestHub(t, "hub-a")
	s := harness.ReserveSyncer(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{Gate: testenv.ImageGate, NotifyURL: s.WebhookURL, NotifyToken: webhookToken})
	tmpl := `--namespace-template={{if eq .Tenant "eu-globex"}}globex{{else}}{{.Tenant}}{{end}}`
	startSyncer(t, s, h, reg.Host, tmpl, "--poll-interval", "1h")

	importImage(t, rawDisk(t, "globex 9"), reg.Host+"/globex/rhel:9")
	h.baseImage(t, "globex", "rhel--9", "created", func(*v1alpha1.BaseImage) bool { return true })
	h.wantNamespaceOwner(t, "globex", "globex")
	intruder := importImage(t, rawDisk(t, "eu-globex 9"), reg.Host+"/eu-globex/centos:9")
	waitRefused := func(s *harness.Syncer, tag string) {
		t.Helper()
		waitLogLine(t, s, "event not applied: the namespace belongs to another tenant",
			"repository=eu-globex/centos", "tag="+tag, "tenant=eu-globex", "namespace=globex", "owner=globex")
	}
	waitRefused(s, "9")
	h.wantNoBaseImagesOf(t, "globex", "eu-globex")

	// Restarted, the syncer learns both repositories from the catalog,
	// eu-globex's first, and applies them in that order.
	s.Stop(t)
	s2 := harness.ReserveSyncer(t)
	startSyncer(t, s2, h, reg.Host, tmpl, "--poll-interval", "1s", "--workers", "1")
	waitRefused(s2, "9")
	importImage(t, rawDisk(t, "eu-globex 10"), reg.Host+"/eu-globex/centos:10")
	importImage(t, rawDisk(t, "globex 10"), reg.Host+"/globex/rhel:10")
	h.baseImage(t, "globex", "rhel--10", "created after the restart", func(*v1alpha1.BaseImage) bool { return true })
	waitRefused(s2, "10")
	h.wantNoBaseImagesOf(t, "globex", "eu-globex")
	h.wantNamespaceOwner(t, "globex", "globex")

	// A BaseImage of eu-globex in globex's namespace, made by hand as the
	// syncer would have made it: refused, and nothing imported for it.
	handMade := &v1alpha1.BaseImage{
		ObjectMeta: metav1.ObjectMeta{Name: cdi.BaseImageName("eu-globex/centos", "9"), Namespace: "globex"},
		Spec:       v1alpha1.BaseImageSpec{Tenant: "eu-globex", Repository: reg.Host + "/eu-globex/centos", Tag: "9", Digest: intruder.Digest},
	}
	h.Create(t, handMade)
	bi := h.baseImage(t, "globex", handMade.Name, "refused", func(b *v1alpha1.BaseImage) bool {
		c := meta.FindStatusCondition(b.Status.Conditions, v1alpha1.ConditionReady)
		return c != nil && c.Reason == "NamespaceOfAnotherTenant"
	})
	msg := meta.FindStatusCondition(bi.Status.Conditions, v1alpha1.ConditionReady).Message
	if !strings.Contains(msg, `belongs to tenant "globex"`) || !strings.Contains(msg, `not to "eu-globex"`) {
		t.Errorf("Ready message %q does not name the namespace's tenant and the BaseImage's", msg)
	}
	if bi.Status.Phase != v1alpha1.PhaseFailed || bi.Status.ObservedDigest != "" {
		t.Errorf("the refused BaseImage: phase %s, observed digest %q; want Failed, none", bi.Status.Phase, bi.Status.ObservedDigest)
	}
	if dvs := h.dataVolumes(t, "globex", cdi.ImageName("eu-globex/centos")); len(dvs) != 0 {
		t.Errorf("eu-globex's image was imported into globex's namespace: %v", slices.Collect(maps.Keys(dvs)))
	}
}

// wantNamespaceOwner checks the tenant recorded on namespace ns.
func (h *testHub) wantNamespaceOwner(t *testing.T, ns, tenant string) {
	t.Helper()
	var n corev1.Namespace
	if err := h.Client.Get(t.Context(), client.ObjectKey{Name: ns}, &n); err != nil {
		t.Fatal(err)
	}
	if got := n.Annotations[hub.AnnotationTenant]; got != tenant {
		t.Errorf("namespace %s: annotation %s=%q, want %q", ns, hub.AnnotationTenant, got, tenant)
	}
}

// wantNoBaseImagesOf checks that namespace ns holds no BaseImage of tenant.
func (h *testHub) wantNoBaseImagesOf(t *testing.T, ns, tenant string) {
	t.Helper()
	var list v1alpha1.BaseImageList
	if err := h.Client.List(t.Context(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, bi := range list.Items {
		if bi.Spec.Tenant == tenant {
			t.Errorf("namespace %s holds BaseImage %s of tenant %s (%s:%s)", ns, bi.Name, tenant, bi.Spec.Repository, bi.Spec.Tag)
		}
	}
}

// waitLogLine waits until the text log of s has a line saying msg with
// every key=value field of fields.
func waitLogLine(t *testing.T, s *harness.Syncer, msg string, fields ...string) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%s to log %q with %v", s, msg, fields), func() (bool, error) {
		data, err := os.ReadFile(s.LogPath)
		if err != nil {
			return false, err
		}
		for line := range strings.Lines(string(data)) {
			have := strings.Fields(line)
			if strings.Contains(line, `msg="`+msg+`"`) && !slices.ContainsFunc(fields, func(f string) bool { return !slices.Contains(have, f) }) {
				return true, nil
			}
		}
		return false, nil
	})
}
