package syncer

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	kubevirtv1 "kubevirt.io/api/core/v1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/imagepipe/imagepipe/pkg/api"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// syncerBin is the image-syncer binary under test, built by TestMain.
var syncerBin string

// TestMain builds image-syncer unless $IMAGE_SYNCER names a binary the
// Makefile built.
func TestMain(m *testing.M) {
	if syncerBin = os.Getenv("IMAGE_SYNCER"); syncerBin != "" {
		os.Exit(testenv.Main(m))
	}
	dir, err := os.MkdirTemp("", "image-syncer-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	syncerBin = filepath.Join(dir, "image-syncer")
	build := exec.Command("go", "build", "-o", syncerBin, "github.com/imagepipe/imagepipe/cmd/image-syncer")
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building image-syncer:", err)
		os.Exit(1)
	}
	code := testenv.Main(m)
	os.RemoveAll(dir)
	os.Exit(code)
}

const (
	webhookToken = "syncer-test-token"
	syncerNS     = "imagepipe-system"
	storageClass = "shared-rwx"
)

// testHub is a hub prepared for the syncer: the BaseImage CRD, the
// syncer's RBAC from config/syncer bound to the hub user "syncer", tenant
// namespaces, and a StorageClass with its StorageProfile.
type testHub struct {
	*harness.Hub
	c client.Client // admin
}

func newScheme(t *testing.T) *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, cdiv1.AddToScheme, v1alpha1.AddToScheme, kubevirtv1.AddToScheme} {
		if err := add(s); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func startTestHub(t *testing.T, name string, modes ...cdiv1.ClaimPropertySet) *testHub {
	t.Helper()
	hub := harness.StartHub(t, name, filepath.Join("..", "..", "config", "crd"))
	c, err := client.New(hub.RestConfig, client.Options{Scheme: newScheme(t)})
	if err != nil {
		t.Fatal(err)
	}
	h := &testHub{Hub: hub, c: c}
	ctx := t.Context()
	for _, ns := range []string{syncerNS, "acme", "globex"} {
		h.create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	}
	h.applySyncerRBAC(t)
	h.create(t, &storagev1.StorageClass{
		ObjectMeta:  metav1.ObjectMeta{Name: storageClass, Annotations: map[string]string{"storageclass.kubernetes.io/is-default-class": "true"}},
		Provisioner: "example.com/shared",
	})
	if len(modes) == 0 {
		block := corev1.PersistentVolumeBlock
		modes = []cdiv1.ClaimPropertySet{{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}, VolumeMode: &block}}
	}
	cdiPublishesStorageProfile(t, ctx, c, storageClass, modes)
	return h
}

func (h *testHub) create(t *testing.T, obj client.Object) {
	t.Helper()
	if err := h.c.Create(t.Context(), obj); err != nil {
		t.Fatalf("hub %s: creating %T %s: %v", h.Name, obj, obj.GetName(), err)
	}
}

// applySyncerRBAC applies config/syncer/rbac.yaml as shipped, bound to the
// hub user "syncer" instead of the ServiceAccount: the syncer runs with
// exactly the rules the manifests grant.
func (h *testHub) applySyncerRBAC(t *testing.T) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "config", "syncer", "rbac.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	user := []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "syncer"}}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var raw runtime.RawExtension
		if err := dec.Decode(&raw); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if len(bytes.TrimSpace(raw.Raw)) == 0 {
			continue
		}
		obj, _, err := clientgoscheme.Codecs.UniversalDeserializer().Decode(raw.Raw, nil, nil)
		if err != nil {
			t.Fatalf("decoding rbac.yaml: %v", err)
		}
		switch o := obj.(type) {
		case *rbacv1.ClusterRoleBinding:
			o.Subjects = user
		case *rbacv1.RoleBinding:
			o.Subjects = user
		}
		h.create(t, obj.(client.Object))
	}
}

// cdiPublishesStorageProfile plays CDI's StorageProfile controller, which
// makes one profile per StorageClass and fills in its property sets.
func cdiPublishesStorageProfile(t *testing.T, ctx context.Context, c client.Client, class string, sets []cdiv1.ClaimPropertySet) {
	t.Helper()
	status := cdiv1.StorageProfileStatus{StorageClass: &class, ClaimPropertySets: sets}
	sp := &cdiv1.StorageProfile{ObjectMeta: metav1.ObjectMeta{Name: class}}
	if err := c.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	sp.Status = status
	if err := c.Status().Update(ctx, sp); err != nil {
		t.Fatal(err)
	}
}

// cdiCompletesImport plays CDI's import controller for one DataVolume:
// the PVC bound, the DataVolume Succeeded at 100%.
func cdiCompletesImport(t *testing.T, h *testHub, ns, name string) {
	t.Helper()
	ctx := t.Context()
	var dv cdiv1.DataVolume
	if err := h.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &dv); err != nil {
		t.Fatalf("hub %s: DataVolume %s/%s: %v", h.Name, ns, name, err)
	}
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: dv.Labels},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      dv.Spec.Storage.AccessModes,
			VolumeMode:       dv.Spec.Storage.VolumeMode,
			StorageClassName: dv.Spec.Storage.StorageClassName,
			Resources:        dv.Spec.Storage.Resources,
		},
	}
	if err := h.c.Create(ctx, pvc); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	pvc.Status.Phase = corev1.ClaimBound
	if err := h.c.Status().Update(ctx, pvc); err != nil {
		t.Fatal(err)
	}
	dv.Status.Phase, dv.Status.Progress = cdiv1.Succeeded, "100.0%"
	if err := h.c.Status().Update(ctx, &dv); err != nil {
		t.Fatal(err)
	}
}

// cdiFailsImport plays CDI's importer failing: the pod restarts until the
// DataVolume's restart count reaches n.
func cdiFailsImport(t *testing.T, h *testHub, ns, name string, restarts int32) {
	t.Helper()
	var dv cdiv1.DataVolume
	if err := h.c.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, &dv); err != nil {
		t.Fatal(err)
	}
	dv.Status.Phase, dv.Status.RestartCount = cdiv1.ImportInProgress, restarts
	if err := h.c.Status().Update(t.Context(), &dv); err != nil {
		t.Fatal(err)
	}
}

// syncer is a running image-syncer process.
type syncer struct {
	webhookURL, metricsURL, healthURL string
	cmd                               *exec.Cmd
	log                               string
	// stop ends the syncer with SIGTERM and expects a clean exit; the
	// test's cleanup calls it too.
	stop    func(t *testing.T)
	stopped chan struct{}
}

// reserveSyncer picks the syncer's ports, so that the registry can be told
// the webhook URL before the syncer starts.
func reserveSyncer(t *testing.T) *syncer {
	t.Helper()
	port := func() string { return "127.0.0.1:" + strconv.Itoa(harness.FreePort(t)) }
	return &syncer{webhookURL: "http://" + port() + "/webhook", metricsURL: "http://" + port() + "/metrics", healthURL: "http://" + port()}
}

// start runs the syncer against hub as the RBAC-bound user "syncer", and
// stops it (SIGTERM, expecting a clean exit) when the test ends.
func (s *syncer) start(t *testing.T, hub *testHub, registryHost string, args ...string) {
	t.Helper()
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(webhookToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s.log = filepath.Join(dir, "syncer.log")
	logf, err := os.Create(s.log)
	if err != nil {
		t.Fatal(err)
	}
	hostPort := func(u string) string { return strings.Split(strings.TrimPrefix(u, "http://"), "/")[0] }
	all := append([]string{
		"--kubeconfig", hub.UserKubeconfig(t, "syncer"),
		"--registry", registryHost,
		"--webhook-listen", hostPort(s.webhookURL),
		"--webhook-token-file", tokenFile,
		"--metrics-listen", hostPort(s.metricsURL),
		"--health-listen", hostPort(s.healthURL),
		"--leader-election-namespace", syncerNS,
		"--storage-class", storageClass,
		"--log-format", "text",
		"--log-level", "info",
	}, args...)
	s.cmd = exec.Command(syncerBin, all...)
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- s.cmd.Wait(); logf.Close() }()
	s.stopped = make(chan struct{})
	s.stop = func(t *testing.T) {
		t.Helper()
		select {
		case <-s.stopped:
			return
		default:
		}
		defer close(s.stopped)
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("image-syncer did not exit cleanly on SIGTERM: %v", err)
			}
		case <-time.After(30 * time.Second):
			_ = s.cmd.Process.Kill()
			t.Errorf("image-syncer did not stop within 30 s of SIGTERM")
		}
	}
	t.Cleanup(func() {
		s.stop(t)
		if t.Failed() {
			if data, err := os.ReadFile(s.log); err == nil {
				t.Logf("image-syncer log (%s):\n%s", hub.Name, tail(data, 80))
			}
		}
	})
	waitFor(t, "image-syncer /readyz", func() (bool, error) {
		select {
		case err := <-exited:
			data, _ := os.ReadFile(s.log)
			return false, fmt.Errorf("image-syncer exited: %v\n%s", err, data)
		default:
		}
		resp, err := http.Get(s.healthURL + "/readyz")
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
}

// metric returns the sum of a Prometheus metric's samples whose labels
// contain every label in match ("kind=\"full\"").
func (s *syncer) metric(t *testing.T, name string, match ...string) float64 {
	t.Helper()
	resp, err := http.Get(s.metricsURL)
	if err != nil {
		t.Fatalf("scraping the syncer: %v", err)
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		ok := true
		for _, m := range match {
			ok = ok && strings.Contains(line, m)
		}
		if !ok {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		sum += v
	}
	return sum
}

func tail(data []byte, lines int) string {
	l := strings.Split(string(data), "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}

// waitFor polls cond until it holds, failing the test after a minute.
func waitFor(t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		ok, err := cond()
		if err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// baseImage waits until the BaseImage of repository:tag on hub satisfies cond.
func (h *testHub) baseImage(t *testing.T, ns, name, what string, cond func(*v1alpha1.BaseImage) bool) *v1alpha1.BaseImage {
	t.Helper()
	var bi v1alpha1.BaseImage
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("hub %s: BaseImage %s/%s last seen: phase %q, status %+v", h.Name, ns, name, bi.Status.Phase, bi.Status.Conditions)
		}
	})
	waitFor(t, fmt.Sprintf("hub %s: BaseImage %s/%s %s", h.Name, ns, name, what), func() (bool, error) {
		err := h.c.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, &bi)
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil && cond(&bi), err
	})
	return &bi
}

// dataVolumes lists the DataVolumes of an image on hub, by name.
func (h *testHub) dataVolumes(t *testing.T, ns, image string) map[string]cdiv1.DataVolume {
	t.Helper()
	var list cdiv1.DataVolumeList
	if err := h.c.List(t.Context(), &list, client.InNamespace(ns), client.MatchingLabels{"imagepipe.io/image": image}); err != nil {
		t.Fatal(err)
	}
	out := map[string]cdiv1.DataVolume{}
	for _, dv := range list.Items {
		out[dv.Name] = dv
	}
	return out
}

// rawDisk writes a small raw disk whose content, and so whose image
// digest, depends on seed.
func rawDisk(t *testing.T, seed string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "disk.raw")
	data := bytes.Repeat([]byte(seed), (1<<20)/len(seed)+1)[:1<<20]
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// importImage runs imagectl import and returns its result.
func importImage(t *testing.T, disk, ref string) api.ImportResult {
	t.Helper()
	return importImageWith(t, "", disk, ref)
}

// importImageWith runs imagectl import with extra flags, feeding stdin
// (e.g. a password for --password-stdin).
func importImageWith(t *testing.T, stdin, disk, ref string, flags ...string) api.ImportResult {
	t.Helper()
	r := testenv.RunCommand(t, testenv.Command{
		Name:  testenv.Imagectl,
		Args:  append([]string{"import", "--quiet", "-o", "json", disk, ref}, flags...),
		Env:   []string{"IMAGEPIPE_CACHE=" + t.TempDir()},
		Stdin: stdin,
	})
	if r.Code != 0 {
		t.Fatalf("imagectl import %s %s: exit %d\n%s", disk, ref, r.Code, r.Stderr)
	}
	var res api.ImportResult
	if err := json.Unmarshal([]byte(r.Stdout), &res); err != nil {
		t.Fatalf("import output %q: %v", r.Stdout, err)
	}
	return res
}
