package harness

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/util/retry"
	kubevirtv1 "kubevirt.io/api/core/v1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
)

const (
	// SyncerNamespace is the namespace StartSyncerHub creates for image-syncer, as config/syncer
	// does; its leader-election Lease lives there.
	SyncerNamespace = "imagepipe-system"
	// SyncerStorageClass is the default StorageClass StartSyncerHub creates, provisioned by
	// the hub's node stand-in (SyncerProvisioner).
	SyncerStorageClass = "shared-rwx"
	// SyncerProvisioner is SyncerStorageClass's provisioner, which the node stand-in plays.
	SyncerProvisioner = "example.com/shared"
	// SyncerWebhookToken is the bearer token every Syncer's webhook requires. Give it to the
	// registry as RegistryOptions.NotifyToken.
	SyncerWebhookToken = "imagepipe-test-webhook-token"

	// syncerStopTimeout is how long a Syncer may take to exit after SIGTERM. Its own graceful
	// shutdown is bounded by --shutdown-timeout (30 s by default).
	syncerStopTimeout = 30 * time.Second
)

// RepoRoot returns the root of the imagepipe repository: the nearest directory at or above the
// working directory that holds go.mod. Tests run in their package's directory and a compiled
// test binary wherever it is started, so paths into config/ are made from this.
func RepoRoot(t T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for d := dir; ; d = filepath.Dir(d) {
		if data, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil && bytes.Contains(data, []byte("module github.com/imagepipe/imagepipe\n")) {
			return d
		}
		if filepath.Dir(d) == d {
			t.Fatalf("no imagepipe go.mod at or above %s", dir)
		}
	}
}

// NewScheme returns a scheme with the Kubernetes, CDI, KubeVirt and BaseImage types, for
// clients of a hub.
func NewScheme(t T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, cdiv1.AddToScheme, kubevirtv1.AddToScheme, v1alpha1.AddToScheme} {
		if err := add(s); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// SyncerHubOptions configures StartSyncerHub. The zero value gives no tenant namespace and a
// StorageProfile offering ReadWriteMany Block.
type SyncerHubOptions struct {
	// Namespaces are the tenant namespaces to create. image-syncer never creates one.
	Namespaces []string
	// StorageModes are the claim property sets the provider gives CDI's StorageProfile for
	// SyncerStorageClass (ConfigureStorageProfile); empty means ReadWriteMany Block.
	StorageModes []cdiv1.ClaimPropertySet
	// NoCDI leaves CDI's controller and the node stand-in out, for a test that needs only the
	// API server (and so neither root nor CDI): SyncerHub.CDI is nil, and DataVolumes stay
	// as created.
	NoCDI bool
	// OVNKubernetes installs OVN-Kubernetes' UserDefinedNetwork and
	// ClusterUserDefinedNetwork CRDs (test/crds/ovn-kubernetes); no OVN-Kubernetes runs.
	OVNKubernetes bool
}

// SyncerHub is a hub prepared for image-syncer as a provider would prepare a real one: the
// BaseImage CRD (config/crd), the namespace SyncerNamespace with the syncer's RBAC from
// config/syncer/rbac.yaml bound to the hub user "syncer" and confined by
// config/syncer/policy.yaml, the tenant namespaces, and a default
// StorageClass whose CDI StorageProfile names the storage modes it offers, and CDI's real
// controller with a node stand-in that provisions that class and runs CDI's importer.
type SyncerHub struct {
	*Hub
	// Client is the admin's controller-runtime client, with NewScheme's types.
	Client client.WithWatch
	// CDI is CDI's controller on this hub, and its node; nil with SyncerHubOptions.NoCDI.
	CDI *CDI
}

// StartSyncerHub starts a hub (StartHub, with the BaseImage CRD) and prepares it for
// image-syncer; see SyncerHub. It stops the hub when the test ends.
func StartSyncerHub(t T, name string, opts SyncerHubOptions) *SyncerHub {
	t.Helper()
	root := RepoRoot(t)
	crds := []string{filepath.Join(root, "config", "crd")}
	if opts.OVNKubernetes {
		crds = append(crds, filepath.Join(root, "test", "crds", "ovn-kubernetes"))
	}
	hub := StartHub(t, name, crds...)
	c, err := client.NewWithWatch(hub.RestConfig, client.Options{Scheme: NewScheme(t)})
	if err != nil {
		t.Fatalf("hub %s: making a client: %v", name, err)
	}
	h := &SyncerHub{Hub: hub, Client: c}
	for _, ns := range append([]string{SyncerNamespace}, opts.Namespaces...) {
		h.Create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	}
	user := []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "syncer"}}
	for _, obj := range ReadManifests(t, filepath.Join(root, "config", "syncer", "rbac.yaml")) {
		switch o := obj.(type) {
		case *rbacv1.ClusterRoleBinding:
			o.Subjects = user
		case *rbacv1.RoleBinding:
			o.Subjects = user
		}
		h.Create(t, obj)
	}
	// The policy confining the syncer, for the hub user it runs as here.
	for _, obj := range ReadManifests(t, filepath.Join(root, "config", "syncer", "policy.yaml")) {
		if p, ok := obj.(*admissionregistrationv1.ValidatingAdmissionPolicy); ok {
			for i, c := range p.Spec.MatchConditions {
				p.Spec.MatchConditions[i].Expression = strings.ReplaceAll(c.Expression, "system:serviceaccount:imagepipe-system:image-syncer", "syncer")
			}
		}
		h.Create(t, obj)
	}
	h.Create(t, &storagev1.StorageClass{
		ObjectMeta:  metav1.ObjectMeta{Name: SyncerStorageClass, Annotations: map[string]string{"storageclass.kubernetes.io/is-default-class": "true"}},
		Provisioner: SyncerProvisioner,
	})
	modes := opts.StorageModes
	if len(modes) == 0 {
		block := corev1.PersistentVolumeBlock
		modes = []cdiv1.ClaimPropertySet{{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}, VolumeMode: &block}}
	}
	h.ConfigureStorageProfile(t, SyncerStorageClass, modes)
	if !opts.NoCDI {
		h.CDI = hub.StartCDI(t, SyncerProvisioner)
	}
	return h
}

// Create creates obj on the hub as the admin, failing the test on any error.
func (h *SyncerHub) Create(t T, obj client.Object) {
	t.Helper()
	if err := h.Client.Create(t.Context(), obj); err != nil {
		t.Fatalf("hub %s: creating %T %s: %v", h.Name, obj, obj.GetName(), err)
	}
}

// BindTenant gives the hub user (one of HubUsers) the tenant RBAC of config/tenant/rbac.yaml,
// under the tenant policy of config/tenant/policy.yaml (the namespace labelled for it):
// the ClusterRole imagepipe-tenant through a RoleBinding in namespace ns only, and
// imagepipe-tenant-storage cluster-wide. It may be called for several users and namespaces.
func (h *SyncerHub) BindTenant(t T, user, ns string) {
	t.Helper()
	for _, file := range []string{"rbac.yaml", "policy.yaml"} {
		for _, obj := range ReadManifests(t, filepath.Join(RepoRoot(t), "config", "tenant", file)) {
			if err := h.Client.Create(t.Context(), obj); err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatalf("hub %s: creating %T %s: %v", h.Name, obj, obj.GetName(), err)
			}
		}
	}
	// The provider labels each tenant namespace, which puts it under the
	// tenant policy (docs/install.md).
	label := fmt.Appendf(nil, `{"metadata":{"labels":{"imagepipe.io/tenant":%q}}}`, ns)
	if err := h.Client.Patch(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, client.RawPatch(types.MergePatchType, label)); err != nil {
		t.Fatalf("hub %s: labelling namespace %s: %v", h.Name, ns, err)
	}
	subjects := []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}
	h.Create(t, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: user, Namespace: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "imagepipe-tenant"},
		Subjects:   subjects,
	})
	storage := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: user + "-storage"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "imagepipe-tenant-storage"},
		Subjects:   subjects,
	}
	if err := h.Client.Create(t.Context(), storage); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("hub %s: binding %s to imagepipe-tenant-storage: %v", h.Name, user, err)
	}
	h.waitAuthorized(t, user, authorizationv1.ResourceAttributes{Namespace: ns, Verb: "create", Group: "kubevirt.io", Resource: "virtualmachines"})
	h.waitAuthorized(t, user, authorizationv1.ResourceAttributes{Verb: "list", Group: "kubevirt.io", Resource: "kubevirts"})
}

// waitAuthorized waits until the API server's authorizer lets user do
// what attrs says. Its RBAC rules come from informers, so a binding just
// created may not count yet for the next request.
func (h *SyncerHub) waitAuthorized(t T, user string, attrs authorizationv1.ResourceAttributes) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: user, ResourceAttributes: &attrs}}
		if err := h.Client.Create(t.Context(), review); err != nil {
			t.Fatalf("hub %s: asking whether %s may %s %s: %v", h.Name, user, attrs.Verb, attrs.Resource, err)
		}
		if review.Status.Allowed {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("hub %s: %s may still not %s %s in %q 10s after binding: %s", h.Name, user, attrs.Verb, attrs.Resource, attrs.Namespace, review.Status.Reason)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ReadManifests decodes the Kubernetes objects of a multi-document YAML file.
func ReadManifests(t T, path string) []client.Object {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var objs []client.Object
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var raw runtime.RawExtension
		if err := dec.Decode(&raw); errors.Is(err, io.EOF) {
			return objs
		} else if err != nil {
			t.Fatalf("decoding %s: %v", path, err)
		}
		if len(bytes.TrimSpace(raw.Raw)) == 0 {
			continue
		}
		obj, _, err := clientgoscheme.Codecs.UniversalDeserializer().Decode(raw.Raw, nil, nil)
		if err != nil {
			t.Fatalf("decoding %s: %v", path, err)
		}
		objs = append(objs, obj.(client.Object))
	}
}

// ConfigureStorageProfile gives CDI's StorageProfile of class the access and volume modes the
// class supports (spec.claimPropertySets), as a provider does for a provisioner CDI does not
// know; CDI's controller then publishes them in the profile's status, where image-syncer reads
// them.
func (h *SyncerHub) ConfigureStorageProfile(t T, class string, sets []cdiv1.ClaimPropertySet) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var sp cdiv1.StorageProfile
		err := h.Client.Get(t.Context(), client.ObjectKey{Name: class}, &sp)
		if apierrors.IsNotFound(err) {
			sp = cdiv1.StorageProfile{ObjectMeta: metav1.ObjectMeta{Name: class}, Spec: cdiv1.StorageProfileSpec{ClaimPropertySets: sets}}
			return h.Client.Create(t.Context(), &sp)
		}
		if err != nil {
			return err
		}
		sp.Spec.ClaimPropertySets = sets
		return h.Client.Update(t.Context(), &sp)
	})
	if err != nil {
		t.Fatalf("hub %s: configuring StorageProfile %s: %v", h.Name, class, err)
	}
}

// Syncer is one image-syncer process on a hub. ReserveSyncer picks its addresses first, so that
// the registry can be configured to notify it before it starts.
type Syncer struct {
	// WebhookURL is where the registry's notifications go: http://127.0.0.1:PORT/webhook,
	// with SyncerWebhookToken as bearer token.
	WebhookURL string
	// MetricsURL is its Prometheus endpoint, http://127.0.0.1:PORT/metrics.
	MetricsURL string
	// HealthURL is the base of /healthz and /readyz, http://127.0.0.1:PORT.
	HealthURL string
	// Args are the arguments Start ran the binary with.
	Args []string
	// LogPath is the file holding its stdout and stderr (text logs), set by Start.
	LogPath string

	hub     string
	proc    *proc
	stopped bool
}

// ReserveSyncer picks free ports on 127.0.0.1 for a syncer's webhook, metrics and health
// endpoints. Another process could take one before Start; the ports are short-lived and
// such a clash fails the test with the syncer's log.
func ReserveSyncer(t T) *Syncer {
	t.Helper()
	addr := func() string { return "127.0.0.1:" + strconv.Itoa(freePort(t)) }
	return &Syncer{WebhookURL: "http://" + addr() + "/webhook", MetricsURL: "http://" + addr() + "/metrics", HealthURL: "http://" + addr()}
}

// Start runs the image-syncer binary bin against hub as the RBAC-bound hub user "syncer", trusting
// the gate's verdicts signed with the provider key (ProviderKeyFiles), with
// the webhook (SyncerWebhookToken), leader election in SyncerNamespace, SyncerStorageClass and
// text logs; args add to or override these flags. It waits until /readyz answers 200 and
// stops the syncer when the test ends (Stop).
func (s *Syncer) Start(t T, bin string, hub *SyncerHub, registryHost string, args ...string) {
	t.Helper()
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "webhook-token")
	if err := os.WriteFile(tokenFile, []byte(SyncerWebhookToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	hostPort := func(u string) string { return strings.SplitN(strings.TrimPrefix(u, "http://"), "/", 2)[0] }
	_, gateKeys := ProviderKeyFiles(t)
	s.Args = append([]string{
		"--kubeconfig", hub.UserKubeconfig(t, "syncer"),
		"--registry", registryHost,
		"--gate-keys", gateKeys,
		"--webhook-listen", hostPort(s.WebhookURL),
		"--webhook-token-file", tokenFile,
		"--metrics-listen", hostPort(s.MetricsURL),
		"--health-listen", hostPort(s.HealthURL),
		"--leader-election-namespace", SyncerNamespace,
		"--storage-class", SyncerStorageClass,
		"--log-format", "text",
		"--log-level", "info",
	}, args...)
	s.LogPath = filepath.Join(dir, "image-syncer.log")
	s.hub = hub.Name
	p, err := startProc(s.LogPath, nil, bin, s.Args...)
	if err != nil {
		t.Fatalf("hub %s: %v", hub.Name, err)
	}
	s.proc = p
	t.Cleanup(func() {
		s.Stop(t)
		logOnFailure(t, "image-syncer on "+hub.Name, s.LogPath)
	})
	probe := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	if err := waitReady(p, httpAnswers(probe, s.HealthURL+"/readyz", nil, http.StatusOK)); err != nil {
		t.Fatalf("hub %s: image-syncer not ready: %v (log %s)", hub.Name, err, s.LogPath)
	}
}

// Pid is the syncer's process ID.
func (s *Syncer) Pid() int { return s.proc.cmd.Process.Pid }

// Stop ends the syncer with SIGTERM and fails the test unless it exits cleanly (status 0)
// within 30 s; it then gets SIGKILL. Stopping a stopped syncer does nothing.
func (s *Syncer) Stop(t T) {
	t.Helper()
	if s.proc == nil || s.stopped {
		return
	}
	s.stopped = true
	stopDaemon(t, s.proc, s.String(), s.LogPath)
}

// stopDaemon ends a daemon (image-syncer, image-gate) with SIGTERM and
// fails the test unless it exits cleanly within syncerStopTimeout; it then
// gets SIGKILL. what names it in messages.
func stopDaemon(t T, p *proc, what, logPath string) {
	t.Helper()
	if !p.exited() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	select {
	case <-p.done:
		p.cancel()
		if p.err != nil {
			t.Errorf("%s did not exit cleanly on SIGTERM: %v (log %s)", what, p.err, logPath)
		}
	case <-time.After(syncerStopTimeout):
		if err := p.kill(); err != nil {
			t.Error(err)
		}
		t.Errorf("%s did not stop within %s of SIGTERM (log %s)", what, syncerStopTimeout, logPath)
	}
}

// Metric returns the sum of a Prometheus metric's samples on the syncer's /metrics whose label
// text contains every string in match (`kind="full"`).
func (s *Syncer) Metric(t T, name string, match ...string) float64 {
	t.Helper()
	resp, err := http.Get(s.MetricsURL)
	if err != nil {
		t.Fatalf("scraping image-syncer on %s: %v", s.hub, err)
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
	if err := sc.Err(); err != nil {
		t.Fatalf("reading image-syncer metrics on %s: %v", s.hub, err)
	}
	return sum
}

// String names the syncer for messages.
func (s *Syncer) String() string { return fmt.Sprintf("image-syncer on %s", s.hub) }
