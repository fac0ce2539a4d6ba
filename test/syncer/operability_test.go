package syncer

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// TestSyncerLogsInOneFormatAndSaysWhichBuild: the real image-syncer, run
// with --log-format json against a real hub, writes nothing on stderr that
// is not one JSON log record — the lines client-go's leader election
// writes through klog included. Its first line names the build --version
// prints and imagepipe_syncer_build_info exports, the kubeconfig it read,
// and the leader lease namespace it took from $POD_NAMESPACE, where the
// lease then is.
func TestSyncerLogsInOneFormatAndSaysWhichBuild(t *testing.T) {
	testenv.RequireQEMU(t)
	r := testenv.RunCommand(t, testenv.Command{Name: testenv.ImageSyncer, Args: []string{"--version"}})
	m := regexp.MustCompile(`^image-syncer version (\S+) \(commit \S+, (go\S+), \S+\)\n$`).FindStringSubmatch(r.Stdout)
	if r.Code != 0 || m == nil || r.Stderr != "" {
		t.Fatalf("image-syncer --version: exit %d, stdout %q, stderr %q", r.Code, r.Stdout, r.Stderr)
	}
	version, goVersion := m[1], m[2]

	hub := startTestHub(t, "hub-a")
	s := harness.ReserveSyncer(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{Gate: testenv.ImageGate, NotifyURL: s.WebhookURL, NotifyToken: webhookToken})
	t.Setenv("POD_NAMESPACE", harness.SyncerNamespace) // as the Deployment sets it; the syncer inherits it
	startSyncer(t, s, hub, reg.Host, "--poll-interval", "1h", "--log-format", "json", "--leader-election-namespace", "")

	if got := s.Metric(t, "imagepipe_syncer_build_info", `version="`+version+`"`, `goversion="`+goVersion+`"`); got != 1 {
		t.Errorf("imagepipe_syncer_build_info{version=%q,goversion=%q} is %v, want 1", version, goVersion, got)
	}
	waitFor(t, "the leader lease in "+harness.SyncerNamespace, func() (bool, error) {
		var lease coordinationv1.Lease
		err := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: harness.SyncerNamespace, Name: "image-syncer.imagepipe.io"}, &lease)
		return err == nil && lease.Spec.HolderIdentity != nil && *lease.Spec.HolderIdentity != "", client.IgnoreNotFound(err)
	})
	// Some work, so that the reconciler and the event broadcaster log too.
	dir := t.TempDir()
	base, top := filepath.Join(dir, "base.qcow2"), filepath.Join(dir, "top.qcow2")
	testenv.Run(t, "qemu-img", "create", "-q", "-f", "qcow2", base, "16M")
	testenv.Run(t, "qemu-img", "create", "-q", "-f", "qcow2", "-b", base, "-F", "qcow2", top)
	pushContainerDisk(t, reg.Host+"/acme/sneaky:1", top)
	hub.baseImage(t, "acme", "sneaky--1", "rejected", func(b *v1alpha1.BaseImage) bool { return b.Status.Phase == v1alpha1.PhaseRejected })
	s.Stop(t) // its shutdown lines count too

	f, err := os.Open(s.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var records []map[string]any
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "--- harness: ") {
			continue // the harness's own note of the command line
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil || rec["time"] == nil || rec["level"] == nil || rec["msg"] == nil {
			t.Errorf("a line that is not a JSON log record: %q", line)
			continue
		}
		records = append(records, rec)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(records) == 0 {
		t.Fatal("the syncer logged nothing")
	}
	first := records[0]
	for key, want := range map[string]any{
		"msg": "image-syncer starting", "version": version, "goVersion": goVersion, "kubeconfig": "--kubeconfig",
		"hub": hub.URL, "leaderElection": true,
		"leaderElectionNamespace": harness.SyncerNamespace, "leaderElectionNamespaceFrom": "$POD_NAMESPACE",
	} {
		if first[key] != want {
			t.Errorf("first log line: %s is %v, want %v (line %v)", key, first[key], want, first)
		}
	}
	witness := "successfully acquired lease " + harness.SyncerNamespace + "/image-syncer.imagepipe.io"
	found := false
	for _, rec := range records {
		if msg, _ := rec["msg"].(string); strings.Contains(msg, witness) {
			found = true
			if rec["logger"] != "klog" {
				t.Errorf("client-go's leader election line does not say it came through klog: %v", rec)
			}
		}
	}
	if !found {
		t.Errorf("no JSON line %q from client-go's leader election (through klog)", witness)
	}
}

// TestSyncerRecordsEventsOnBaseImages: the syncer records Kubernetes
// Events on a BaseImage, readable through both events APIs with the
// BaseImage as involvedObject/regarding: one when its digest is rejected
// (the rejection's reason), one per failed import attempt that is retried,
// one when it gives up, and one when the retry annotation starts the
// attempts over. Reconciling the same state again records nothing more.
func TestSyncerRecordsEventsOnBaseImages(t *testing.T) {
	testenv.RequireQEMU(t)
	// acme's own credential is refused: CDI's importer fails, every attempt.
	hub, reg := startSyncerWithRevokedTenantCredential(t)
	dir := t.TempDir()

	good := importImageWith(t, "pull-only", rawDisk(t, "never imports"), reg.Host+"/acme/rhel:9", "--username", "robot", "--password-stdin")
	base, top := filepath.Join(dir, "base.qcow2"), filepath.Join(dir, "top.qcow2")
	testenv.Run(t, "qemu-img", "create", "-q", "-f", "qcow2", base, "16M")
	testenv.Run(t, "qemu-img", "create", "-q", "-f", "qcow2", "-b", base, "-F", "qcow2", top)
	pushContainerDisk(t, reg.Host+"/acme/sneaky:1", top, remote.WithAuth(&authn.Basic{Username: "robot", Password: "pull-only"}))

	sneaky := hub.baseImage(t, "acme", "sneaky--1", "rejected", func(b *v1alpha1.BaseImage) bool { return b.Status.Phase == v1alpha1.PhaseRejected })
	rejected := hub.waitEvents(t, sneaky, func(es []corev1.Event) bool { return len(es) > 0 })
	hub.wantEvent(t, sneaky, rejected, corev1.EventTypeWarning, "BackingFile", "backing-file", sneaky.Status.ObservedDigest)

	// Two attempts, each three restarts of CDI's real importer.
	rhel := &v1alpha1.BaseImage{}
	harness.WaitUntil(t, "BaseImage acme/rhel--9 failed", 2*importTimeout, 100*time.Millisecond, func() (bool, error) {
		err := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: "acme", Name: "rhel--9"}, rhel)
		return err == nil && rhel.Status.Phase == v1alpha1.PhaseFailed, client.IgnoreNotFound(err)
	})
	failed := hub.waitEvents(t, rhel, func(es []corev1.Event) bool { return len(es) >= 2 })
	hub.wantEvent(t, rhel, failed, corev1.EventTypeWarning, "Retrying", "import attempt 1 of 2 failed", "authentication required")
	hub.wantEvent(t, rhel, failed, corev1.EventTypeWarning, "RetriesExhausted", "the import of "+good.Digest+" failed 2 times")

	// Reconcile the rejected BaseImage again (the retry annotation, which
	// the syncer removes), then start rhel's attempts over; the Event of
	// that second change comes after whatever the first one recorded.
	annotateRetry(t, hub, sneaky)
	hub.baseImage(t, "acme", "sneaky--1", "reconciled again", func(b *v1alpha1.BaseImage) bool {
		_, annotated := b.Annotations[v1alpha1.AnnotationRetry]
		return !annotated && b.Status.Phase == v1alpha1.PhaseRejected
	})
	annotateRetry(t, hub, rhel)
	restarted := hub.waitEvents(t, rhel, func(es []corev1.Event) bool {
		for _, e := range es {
			if e.Type == corev1.EventTypeNormal {
				return true
			}
		}
		return false
	})
	hub.wantEvent(t, rhel, restarted, corev1.EventTypeNormal, "Retrying", "imports start over")
	hub.wantEvent(t, sneaky, hub.waitEvents(t, sneaky, func([]corev1.Event) bool { return true }),
		corev1.EventTypeWarning, "BackingFile", "backing-file")
	hub.wantEvent(t, rhel, restarted, corev1.EventTypeWarning, "RetriesExhausted", "failed 2 times")

	// The other events API shows the same Events, regarding the BaseImage.
	var list eventsv1.EventList
	if err := hub.Client.List(t.Context(), &list, client.InNamespace("acme")); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range list.Items {
		if e.Regarding.UID == sneaky.UID && e.Reason == "BackingFile" {
			found = e.Regarding.Kind == "BaseImage" && e.Regarding.Name == "sneaky--1" && e.Type == corev1.EventTypeWarning
		}
	}
	if !found {
		t.Errorf("events.k8s.io/v1 shows no BackingFile Event regarding BaseImage acme/sneaky--1: %+v", list.Items)
	}
}

// annotateRetry asks the syncer to start the BaseImage's imports over.
func annotateRetry(t *testing.T, h *testHub, bi *v1alpha1.BaseImage) {
	t.Helper()
	var cur v1alpha1.BaseImage
	if err := h.Client.Get(t.Context(), client.ObjectKeyFromObject(bi), &cur); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(cur.DeepCopy())
	if cur.Annotations == nil {
		cur.Annotations = map[string]string{}
	}
	cur.Annotations[v1alpha1.AnnotationRetry] = "now"
	if err := h.Client.Patch(t.Context(), &cur, patch); err != nil {
		t.Fatal(err)
	}
}

// waitEvents waits until the core/v1 Events whose involvedObject is bi
// satisfy cond, and returns them.
func (h *testHub) waitEvents(t *testing.T, bi *v1alpha1.BaseImage, cond func([]corev1.Event) bool) []corev1.Event {
	t.Helper()
	var out []corev1.Event
	waitFor(t, "Events on BaseImage "+bi.Namespace+"/"+bi.Name, func() (bool, error) {
		var list corev1.EventList
		if err := h.Client.List(t.Context(), &list, client.InNamespace(bi.Namespace)); err != nil {
			return false, err
		}
		out = out[:0]
		for _, e := range list.Items {
			if e.InvolvedObject.Name == bi.Name && e.InvolvedObject.Kind == "BaseImage" {
				out = append(out, e)
			}
		}
		return cond(out), nil
	})
	return out
}

// wantEvent checks that events hold exactly one Event of type and reason,
// recorded once (count 1) by image-syncer on bi, whose message says each
// of says.
func (h *testHub) wantEvent(t *testing.T, bi *v1alpha1.BaseImage, events []corev1.Event, typ, reason string, says ...string) {
	t.Helper()
	var match []corev1.Event
	for _, e := range events {
		if e.Type == typ && e.Reason == reason {
			match = append(match, e)
		}
	}
	if len(match) != 1 || match[0].Count != 1 {
		t.Errorf("BaseImage %s: %d %s Events %s, want one recorded once: %+v", bi.Name, len(match), typ, reason, match)
		return
	}
	e := match[0]
	ref := e.InvolvedObject
	if ref.APIVersion != v1alpha1.GroupVersion.String() || ref.Namespace != bi.Namespace || ref.UID != bi.UID || e.Source.Component != "image-syncer" {
		t.Errorf("Event %s: involvedObject %+v, source %+v; want BaseImage %s/%s (uid %s) by image-syncer", reason, ref, e.Source, bi.Namespace, bi.Name, bi.UID)
	}
	for _, s := range says {
		if !strings.Contains(e.Message, s) {
			t.Errorf("Event %s: message %q does not say %q", reason, e.Message, s)
		}
	}
}
