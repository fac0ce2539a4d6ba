package syncer

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// defaultBackend is a reverse proxy in front of the registry that can be
// switched to answer every request 404 text/html, as an ingress does when
// its backend is gone.
type defaultBackend struct {
	proxy *httputil.ReverseProxy
	down  atomic.Bool
	hits  atomic.Int64 // requests answered 404 while down
}

func (d *defaultBackend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if d.down.Load() {
		d.hits.Add(1)
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, "<html><body><center><h1>404 Not Found</h1></center><hr><center>default backend</center></body></html>\n")
		return
	}
	d.proxy.ServeHTTP(w, r)
}

// TestSyncerTakesNoDeleteFromADefaultBackend: the syncer reaches the real
// registry through a proxy that starts answering 404 text/html to
// everything. A delete notification for the tag then cannot be confirmed:
// the event is retried, and the BaseImage and its DataSource stay, even
// under --on-delete delete. Once the registry answers again, a real delete
// goes through.
func TestSyncerTakesNoDeleteFromADefaultBackend(t *testing.T) {
	t.Parallel()
	testenv.RequireQEMU(t)
	hub := startTestHub(t, "hub-a")
	s := harness.ReserveSyncer(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{Gate: testenv.ImageGate, NotifyURL: s.WebhookURL, NotifyToken: webhookToken})
	front := &defaultBackend{proxy: httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: reg.Host})}
	srv := httptest.NewServer(front)
	t.Cleanup(srv.Close)
	proxyHost := strings.TrimPrefix(srv.URL, "http://")
	startSyncer(t, s, hub, proxyHost, "--poll-interval", "1h", "--on-delete", "delete")

	v1 := importImage(t, rawDisk(t, "behind an ingress"), reg.Host+"/acme/rhel:9")
	hub.baseImage(t, "acme", "rhel--9", "importing", func(b *v1alpha1.BaseImage) bool { return b.Status.ObservedDigest == v1.Digest })
	hub.CDI.WaitImported(t, "acme", dvName(v1.Digest), importTimeout)
	hub.baseImage(t, "acme", "rhel--9", "ready", func(b *v1alpha1.BaseImage) bool { return b.Status.Phase == v1alpha1.PhaseReady })

	front.down.Store(true)
	before := s.Metric(t, "imagepipe_syncer_events_total", `source="distribution"`, `result="retried"`)
	deleteEvent := `{"events":[{"action":"delete","target":{"repository":"acme/rhel","tag":"9"}}]}`
	req, _ := http.NewRequest(http.MethodPost, s.WebhookURL, strings.NewReader(deleteEvent))
	req.Header.Set("Authorization", "Bearer "+webhookToken)
	req.Header.Set("Content-Type", "application/vnd.docker.distribution.events.v2+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("delete notification: status %d", resp.StatusCode)
	}
	waitFor(t, "the delete to be tried against the default backend and retried", func() (bool, error) {
		return front.hits.Load() > 0 && s.Metric(t, "imagepipe_syncer_events_total", `source="distribution"`, `result="retried"`) > before, nil
	})
	bi := hub.baseImage(t, "acme", "rhel--9", "still there", func(*v1alpha1.BaseImage) bool { return true })
	if _, removed := bi.Annotations[v1alpha1.AnnotationRemoved]; removed || bi.Status.Phase != v1alpha1.PhaseReady {
		t.Fatalf("a 404 from the default backend confirmed the delete: phase %s, annotations %v", bi.Status.Phase, bi.Annotations)
	}
	if err := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: "acme", Name: "rhel--9"}, &cdiv1.DataSource{}); err != nil {
		t.Fatalf("the DataSource: %v", err)
	}

	// The registry is back and the tag is really deleted: now it goes.
	front.down.Store(false)
	testenv.Run(t, testenv.Imagectl, "delete", "--force", reg.Host+"/acme/rhel:9")
	waitFor(t, "the BaseImage deleted once the registry confirms", func() (bool, error) {
		err := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: "acme", Name: "rhel--9"}, &v1alpha1.BaseImage{})
		return apierrors.IsNotFound(err), nil
	})
}
