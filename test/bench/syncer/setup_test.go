//go:build linux

package syncer

// The set-up below mirrors test/syncer's helpers (a hub prepared for the syncer, the syncer
// process, a /metrics scrape), which live in a _test package and cannot be imported.

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
	"k8s.io/client-go/rest"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/imagepipe/imagepipe/pkg/api"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

const (
	webhookToken = "syncer-bench-token"
	syncerNS     = "imagepipe-system"
	tenantNS     = "acme"
	storageClass = "shared-rwx"
)

// repoRoot is the repository root, seen from this package's directory.
var repoRoot = filepath.Join("..", "..", "..")

// hub is a hub prepared for the syncer: the BaseImage CRD, the syncer's RBAC from config/syncer
// bound to the hub user "syncer", the tenant namespace acme, and a default StorageClass whose
// StorageProfile (played for CDI) offers ReadWriteMany Block.
type hub struct {
	*harness.Hub
	c    client.WithWatch // admin
	http *http.Client     // admin, for the apiserver's own /metrics
}

func newScheme(t testing.TB) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, cdiv1.AddToScheme, v1alpha1.AddToScheme} {
		if err := add(s); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func startHub(t *testing.T, name string) *hub {
	t.Helper()
	h := &hub{Hub: harness.StartHub(t, name, filepath.Join(repoRoot, "config", "crd"))}
	var err error
	if h.c, err = client.NewWithWatch(h.RestConfig, client.Options{Scheme: newScheme(t)}); err != nil {
		t.Fatal(err)
	}
	if h.http, err = rest.HTTPClientFor(h.RestConfig); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{syncerNS, tenantNS} {
		h.create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	}
	h.applySyncerRBAC(t)
	h.create(t, &storagev1.StorageClass{
		ObjectMeta:  metav1.ObjectMeta{Name: storageClass, Annotations: map[string]string{"storageclass.kubernetes.io/is-default-class": "true"}},
		Provisioner: "example.com/shared",
	})
	h.cdiPublishesStorageProfile(t, storageClass)
	return h
}

// cdiPublishesStorageProfile plays CDI's StorageProfile controller, which makes one profile per
// StorageClass and publishes its claim property sets in the status: here ReadWriteMany Block.
func (h *hub) cdiPublishesStorageProfile(t *testing.T, class string) {
	t.Helper()
	block := corev1.PersistentVolumeBlock
	status := cdiv1.StorageProfileStatus{StorageClass: &class, ClaimPropertySets: []cdiv1.ClaimPropertySet{
		{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}, VolumeMode: &block},
	}}
	sp := &cdiv1.StorageProfile{ObjectMeta: metav1.ObjectMeta{Name: class}, Status: status}
	h.create(t, sp)
	// The CRD of CDI API v1.64 has a status subresource, which drops the status on create;
	// older ones have none, and there the create already wrote it (and this update is a 404).
	sp.Status = status
	if err := h.c.Status().Update(t.Context(), sp); err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("hub %s: publishing StorageProfile %s: %v", h.Name, class, err)
	}
}

func (h *hub) create(t *testing.T, obj client.Object) {
	t.Helper()
	if err := h.c.Create(t.Context(), obj); err != nil {
		t.Fatalf("hub %s: creating %T %s: %v", h.Name, obj, obj.GetName(), err)
	}
}

// applySyncerRBAC applies config/syncer/rbac.yaml as shipped, bound to the hub user "syncer".
func (h *hub) applySyncerRBAC(t *testing.T) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "config", "syncer", "rbac.yaml"))
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

// apiserverMetrics scrapes the hub's kube-apiserver /metrics as the admin.
func (h *hub) apiserverMetrics(t *testing.T) metrics {
	t.Helper()
	m, err := scrape(t.Context(), h.http, h.URL+"/metrics")
	if err != nil {
		t.Fatalf("hub %s: scraping the apiserver: %v", h.Name, err)
	}
	return m
}

// syncer is one image-syncer process.
type syncer struct {
	webhookURL, metricsURL, healthURL string
	cmd                               *exec.Cmd
	log                               string
}

// reserveSyncer picks the syncer's ports, so that the registry can be told the webhook URL
// before the syncer starts.
func reserveSyncer(t *testing.T) *syncer {
	t.Helper()
	port := func() string { return "127.0.0.1:" + strconv.Itoa(harness.FreePort(t)) }
	return &syncer{webhookURL: "http://" + port() + "/webhook", metricsURL: "http://" + port() + "/metrics", healthURL: "http://" + port()}
}

// start runs the syncer against h as the RBAC-bound user "syncer", waits for /readyz, and stops
// it with SIGTERM when the test ends.
func (s *syncer) start(t *testing.T, h *hub, registryHost string, args ...string) {
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
		"--kubeconfig", h.UserKubeconfig(t, "syncer"),
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
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlive the test binary
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- s.cmd.Wait(); logf.Close() }()
	t.Cleanup(func() {
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("image-syncer on %s did not exit cleanly on SIGTERM: %v", h.Name, err)
			}
		case <-time.After(30 * time.Second):
			_ = s.cmd.Process.Kill()
			t.Errorf("image-syncer on %s did not stop within 30 s of SIGTERM", h.Name)
		}
		if t.Failed() {
			if data, err := os.ReadFile(s.log); err == nil {
				t.Logf("image-syncer log (%s):\n%s", h.Name, tail(data, 60))
			}
		}
	})
	waitUntil(t, "image-syncer /readyz on "+h.Name, time.Minute, 50*time.Millisecond, func() (bool, error) {
		select {
		case err := <-exited:
			data, _ := os.ReadFile(s.log)
			return false, fmt.Errorf("image-syncer exited: %v\n%s", err, tail(data, 40))
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

// metrics scrapes the syncer's /metrics.
func (s *syncer) metrics(t *testing.T) metrics {
	t.Helper()
	m, err := scrape(t.Context(), http.DefaultClient, s.metricsURL)
	if err != nil {
		t.Fatalf("scraping the syncer: %v", err)
	}
	return m
}

// memory reads the syncer's peak and current resident set size, in KiB, from /proc.
func (s *syncer) memory(t *testing.T) (peakKiB, nowKiB int64) {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.cmd.Process.Pid))
	if err != nil {
		t.Fatalf("reading the syncer's memory: %v", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmHWM:":
			peakKiB = v
		case "VmRSS:":
			nowKiB = v
		}
	}
	return peakKiB, nowKiB
}

// sample is one Prometheus sample.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

// metrics is one scrape, in the Prometheus text format.
type metrics []sample

// sum adds the samples of name whose labels include every pair of match.
func (m metrics) sum(name string, match ...string) float64 {
	return m.sumIf(name, func(l map[string]string) bool {
		for i := 0; i+1 < len(match); i += 2 {
			if l[match[i]] != match[i+1] {
				return false
			}
		}
		return true
	})
}

// sumIf adds the samples of name whose labels keep says yes to.
func (m metrics) sumIf(name string, keep func(map[string]string) bool) float64 {
	var total float64
	for _, s := range m {
		if s.name == name && keep(s.labels) {
			total += s.value
		}
	}
	return total
}

func scrape(ctx context.Context, c *http.Client, url string) (metrics, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return parseMetrics(resp.Body)
}

// parseMetrics reads the Prometheus text format: `name{k="v",...} value [timestamp]` lines,
// comments skipped.
func parseMetrics(r io.Reader) (metrics, error) {
	var out metrics
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		s := sample{labels: map[string]string{}}
		rest := line
		if i := strings.IndexAny(line, "{ "); i < 0 {
			return nil, fmt.Errorf("metric line %q", line)
		} else {
			s.name, rest = line[:i], line[i:]
		}
		if rest[0] == '{' {
			var err error
			if rest, err = parseLabels(rest[1:], s.labels); err != nil {
				return nil, fmt.Errorf("metric line %q: %w", line, err)
			}
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			return nil, fmt.Errorf("metric line %q has no value", line)
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return nil, fmt.Errorf("metric line %q: %w", line, err)
		}
		s.value = v
		out = append(out, s)
	}
	return out, sc.Err()
}

// parseLabels reads `k="v",...}` into labels and returns what follows the closing brace.
func parseLabels(s string, labels map[string]string) (string, error) {
	for {
		s = strings.TrimLeft(s, ", ")
		if strings.HasPrefix(s, "}") {
			return s[1:], nil
		}
		eq := strings.IndexByte(s, '=')
		if eq < 0 || len(s) < eq+2 || s[eq+1] != '"' {
			return "", fmt.Errorf("malformed labels at %q", s)
		}
		key := strings.TrimSpace(s[:eq])
		var v strings.Builder
		i := eq + 2
		for ; i < len(s) && s[i] != '"'; i++ {
			if s[i] == '\\' && i+1 < len(s) {
				i++
				switch s[i] {
				case 'n':
					v.WriteByte('\n')
				default:
					v.WriteByte(s[i])
				}
				continue
			}
			v.WriteByte(s[i])
		}
		if i >= len(s) {
			return "", fmt.Errorf("unterminated label value at %q", s)
		}
		labels[key] = v.String()
		s = s[i+1:]
	}
}

// rawDisk writes a 1 MiB raw disk whose content, and so whose image digest, depends on seed.
func rawDisk(t *testing.T, path, seed string) {
	t.Helper()
	data := bytes.Repeat([]byte(seed), (1<<20)/len(seed)+1)[:1<<20]
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// importImage runs imagectl import with a fresh IMAGEPIPE_CACHE and returns its result.
func importImage(t *testing.T, disk, ref string) api.ImportResult {
	t.Helper()
	cache, err := os.MkdirTemp("", "imagectl-cache-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(cache)
	r := testenv.RunCommand(t, testenv.Command{
		Name: testenv.Imagectl,
		Args: []string{"import", "--quiet", "-o", "json", disk, ref},
		Env:  []string{"IMAGEPIPE_CACHE=" + cache},
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

// waitUntil polls cond every interval until it holds, failing the test after timeout.
func waitUntil(t *testing.T, what string, timeout, interval time.Duration, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		select {
		case <-t.Context().Done():
			t.Fatalf("waiting for %s: %v", what, t.Context().Err())
		case <-time.After(interval):
		}
	}
}

func tail(data []byte, lines int) string {
	l := strings.Split(string(data), "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}
