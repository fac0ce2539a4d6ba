package harness

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/imagepipe/imagepipe/test/nodestandin"

	"github.com/imagepipe/imagepipe/internal/need"
)

const (
	// CDIImporterImage is the importer image CDI's controller is told to use; the node stand-in
	// runs the cdi-importer binary built by buildtools.sh for it.
	CDIImporterImage = "quay.io/kubevirt/cdi-importer:v1.64.0"
	// cdiNamespace is where CDI's controller keeps its lease and config maps.
	cdiNamespace = "cdi"
)

// CDI is CDI's real controller (cdi-controller v1.64.0, built by buildtools.sh) running against
// a hub, with the parts of a cluster it needs: kube-controller-manager (garbage collection,
// namespace deletion, persistent-volume binding, PVC protection) and a node stand-in (test/nodestandin) that
// provisions claims of the hub's StorageClass and runs importer pods as local processes of the
// real cdi-importer.
type CDI struct {
	// Node is the hub's one node.
	Node *nodestandin.Node

	hub    *Hub
	client client.Client
}

// StartControllerManager starts kube-controller-manager on the hub with the named controllers
// only (garbage-collector-controller, namespace-controller, resourcequota-controller, ...), and
// stops it when the test ends; for a hub without CDI, whose StartCDI starts its own.
func (h *Hub) StartControllerManager(t T, controllers ...string) {
	t.Helper()
	dir := filepath.Join(h.dir, "kcm")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	h.startControllerManager(t, Binary(t, "kube-controller-manager"), dir, controllers...)
}

func (h *Hub) startControllerManager(t T, bin, dir string, controllers ...string) {
	t.Helper()
	kcmLog := filepath.Join(dir, "kube-controller-manager.log")
	kcm, err := startProc(kcmLog, nil, bin,
		"--kubeconfig", h.Kubeconfig, "--leader-elect=false", "--secure-port=0",
		"--controllers="+strings.Join(controllers, ","),
	)
	if err != nil {
		t.Fatalf("hub %s: %v", h.Name, err)
	}
	t.Cleanup(func() {
		if err := kcm.stop(); err != nil {
			t.Errorf("stopping hub %s kube-controller-manager: %v", h.Name, err)
		}
		logOnFailure(t, "hub "+h.Name+" kube-controller-manager", kcmLog)
	})
}

// StartCDI starts kube-controller-manager, CDI's controller and a node stand-in serving claims of
// StorageClasses whose provisioner is provisioner, and stops them when the test ends. It creates
// the CDI object and the namespace cdi as CDI's operator would. Pods it runs, volumes and logs
// live under t.TempDir(); the logs are printed when the test fails. It skips the test when a
// binary is missing or the test does not run as root.
func (h *Hub) StartCDI(t T, provisioner string) *CDI {
	t.Helper()
	need.Root(t, "CDI's controller and the node stand-in make mount and network namespaces (unshare, mount, losetup)")
	kcmBin := Binary(t, "kube-controller-manager")
	controllerBin := Binary(t, "cdi-controller")
	importerBin := Binary(t, "cdi-importer")
	c, err := client.New(h.RestConfig, client.Options{Scheme: NewScheme(t)})
	if err != nil {
		t.Fatal(err)
	}
	cdi := &CDI{hub: h, client: c}
	dir := filepath.Join(h.dir, "cdi")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}

	h.startControllerManager(t, kcmBin, dir, "garbage-collector-controller", "namespace-controller", "persistentvolume-binder-controller", "persistentvolumeclaim-protection-controller", "persistentvolume-protection-controller")

	ctx := t.Context()
	for _, obj := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: cdiNamespace}},
		&cdiv1.CDI{ObjectMeta: metav1.ObjectMeta{Name: "cdi"}},
	} {
		if err := c.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("hub %s: creating %T: %v", h.Name, obj, err)
		}
	}
	cdi.startController(t, controllerBin, dir)

	nodeLog := filepath.Join(dir, "node-standin.log")
	logFile, err := os.OpenFile(nodeLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	var logMu sync.Mutex
	kube, err := kubernetes.NewForConfig(h.RestConfig)
	if err != nil {
		t.Fatal(err)
	}
	cdi.Node, err = nodestandin.Start(ctx, nodestandin.Config{
		Name: "node-" + h.Name, Dir: filepath.Join(dir, "node"), Provisioner: provisioner,
		Images: map[string]string{CDIImporterImage: importerBin},
		Client: kube,
		Log: func(format string, args ...any) {
			logMu.Lock()
			defer logMu.Unlock()
			fmt.Fprintf(logFile, time.Now().Format("15:04:05.000 ")+format+"\n", args...)
		},
	})
	if err != nil {
		t.Fatalf("hub %s: starting the node stand-in: %v", h.Name, err)
	}
	t.Cleanup(func() {
		cdi.Node.Stop()
		logFile.Close()
		logOnFailure(t, "hub "+h.Name+" node stand-in", nodeLog)
		if t.Failed() {
			logPodsOnFailure(t, h.Name, filepath.Join(dir, "node", "pods"))
		}
	})

	// CDI's controller is at work once it has made its CDIConfig.
	WaitUntil(t, "hub "+h.Name+": CDI's controller makes its CDIConfig", readyTimeout, 100*time.Millisecond, func() (bool, error) {
		err := c.Get(ctx, client.ObjectKey{Name: "config"}, &cdiv1.CDIConfig{})
		return err == nil, client.IgnoreNotFound(err)
	})
	return cdi
}

// startController runs cdi-controller in private mount and network namespaces: its metrics
// port (:8443) and the paths it insists on (/var/run/cdi/token/keys, /var/run/certs, /tmp/ready)
// would otherwise collide between hubs. It reaches the apiserver through a Unix socket that this
// process forwards to the apiserver's port, listened on inside its namespace by socat.
func (cdi *CDI) startController(t T, bin, dir string) {
	t.Helper()
	h := cdi.hub
	secrets := filepath.Join(dir, "secrets")
	for _, d := range []string{"keys", "upload-server", "upload-client"} {
		if err := os.MkdirAll(filepath.Join(secrets, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := writeRSAKeyPair(filepath.Join(secrets, "keys")); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"upload-server", "upload-client"} {
		certs, err := writeCerts(filepath.Join(secrets, d))
		if err != nil {
			t.Fatal(err)
		}
		for from, to := range map[string]string{certs.Cert: "tls.crt", certs.Key: "tls.key"} {
			if err := os.Rename(from, filepath.Join(secrets, d, to)); err != nil {
				t.Fatal(err)
			}
		}
	}

	u, err := url.Parse(h.URL)
	if err != nil {
		t.Fatal(err)
	}
	sock := forwardUnixToTCP(t, u.Host)
	script := strings.Join([]string{
		"set -eu",
		"ip link set lo up",
		"mount -t tmpfs -o mode=0755 cdi-run /run",
		"mkdir -p /run/cdi/token /run/certs",
		`cp -r "$1/keys" /run/cdi/token/keys`,
		`cp -r "$1/upload-server" /run/certs/cdi-uploadserver-signer`,
		`cp -r "$1/upload-client" /run/certs/cdi-uploadserver-client-signer`,
		`cp "$2" /run/kubeconfig`,
		// The socket lives under the host's /tmp, which the private /tmp below hides.
		`mkdir /run/api && mount --bind "$(dirname "$3")" /run/api`,
		`socat "TCP-LISTEN:$4,bind=127.0.0.1,fork,reuseaddr" "UNIX-CONNECT:/run/api/$(basename "$3")" &`,
		`until ss -Hltn "sport = :$4" | grep -q .; do sleep 0.05; done`,
		// The binary may live under /tmp too (a cache in $HOME=/tmp/...):
		// keep it in view before the private /tmp hides it.
		`touch /run/cdi-controller && mount --bind "$5" /run/cdi-controller`,
		"mount -t tmpfs -o mode=1777 cdi-tmp /tmp",
		`exec /run/cdi-controller -kubeconfig /run/kubeconfig -v=1`,
	}, "\n")
	env := []string{
		"IMPORTER_IMAGE=" + CDIImporterImage,
		"CLONER_IMAGE=quay.io/kubevirt/cdi-cloner:v1.64.0",
		"UPLOADSERVER_IMAGE=quay.io/kubevirt/cdi-uploadserver:v1.64.0",
		"OVIRT_POPULATOR_IMAGE=quay.io/kubevirt/cdi-importer:v1.64.0",
		"UPLOADPROXY_SERVICE=cdi-uploadproxy",
		"PULL_POLICY=IfNotPresent",
	}
	logPath := filepath.Join(dir, "cdi-controller.log")
	p, err := startProc(logPath, env, "unshare", "--mount", "--net", "--propagation", "private", "--kill-child",
		"--", "/bin/sh", "-c", script, "cdi-controller", secrets, h.Kubeconfig, sock, u.Port(), bin)
	if err != nil {
		t.Fatalf("hub %s: %v", h.Name, err)
	}
	t.Cleanup(func() {
		if err := p.stop(); err != nil {
			t.Errorf("stopping hub %s cdi-controller: %v", h.Name, err)
		}
		logOnFailure(t, "hub "+h.Name+" cdi-controller", logPath)
	})
}

// forwardUnixToTCP listens on a new Unix socket and forwards each connection to addr until the
// test ends, returning the socket's path (short: Unix socket paths are limited to 108 bytes).
func forwardUnixToTCP(t T, addr string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "hub")
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "api.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		l.Close()
		wg.Wait()
		os.RemoveAll(dir)
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer in.Close()
				out, err := net.DialTimeout("tcp", addr, 5*time.Second)
				if err != nil {
					return
				}
				defer out.Close()
				done := make(chan struct{})
				go func() {
					io.Copy(out, in)
					out.(*net.TCPConn).CloseWrite()
					close(done)
				}()
				io.Copy(in, out)
				in.(*net.UnixConn).CloseWrite()
				<-done
			}()
		}
	}()
	return sock
}

// writeRSAKeyPair writes id_rsa and id_rsa.pub (PEM), the token signing keys CDI's controller
// reads.
func writeRSAKeyPair(dir string) error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "id_rsa"), pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "id_rsa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o600)
}

// AllowInsecureRegistry adds host (host:port) to CDIConfig's spec.insecureRegistries, as a
// provider does (kubectl patch cdiconfig config) for a registry served over plain HTTP or with a
// certificate the importer cannot verify. The CDI object carries no config-authority annotation,
// so CDIConfig's spec is where CDI's controller reads it.
func (cdi *CDI) AllowInsecureRegistry(t T, host string) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var cfg cdiv1.CDIConfig
		if err := cdi.client.Get(t.Context(), client.ObjectKey{Name: "config"}, &cfg); err != nil {
			return err
		}
		if slices.Contains(cfg.Spec.InsecureRegistries, host) {
			return nil
		}
		cfg.Spec.InsecureRegistries = append(cfg.Spec.InsecureRegistries, host)
		return cdi.client.Update(t.Context(), &cfg)
	})
	if err != nil {
		t.Fatalf("hub %s: allowing insecure registry %s: %v", cdi.hub.Name, host, err)
	}
}

// WaitImported waits until CDI reports the DataVolume Succeeded, failing the test at once when it
// reports Failed or a third importer restart, and returns it.
func (cdi *CDI) WaitImported(t T, ns, name string, timeout time.Duration) *cdiv1.DataVolume {
	t.Helper()
	var dv cdiv1.DataVolume
	WaitUntil(t, fmt.Sprintf("hub %s: CDI imports DataVolume %s/%s", cdi.hub.Name, ns, name), timeout, 200*time.Millisecond, func() (bool, error) {
		if err := cdi.client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, &dv); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		if dv.Status.Phase == cdiv1.Failed || dv.Status.RestartCount >= 3 {
			return false, fmt.Errorf("CDI reports the import failing (phase %s, %d importer restarts): %s", dv.Status.Phase, dv.Status.RestartCount, runningMessage(&dv))
		}
		return dv.Status.Phase == cdiv1.Succeeded, nil
	})
	return &dv
}

// CopyImportedDisk copies the disk CDI imported into the claim of DataVolume ns/name to dst.
func (cdi *CDI) CopyImportedDisk(t T, ns, name, dst string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := cdi.Node.CopyClaimDisk(ctx, ns, name, dst); err != nil {
		t.Fatalf("hub %s: reading the volume of %s/%s: %v", cdi.hub.Name, ns, name, err)
	}
}

// logPodsOnFailure prints the log of every container the node stand-in ran.
func logPodsOnFailure(t T, hub, dir string) {
	logs, _ := filepath.Glob(filepath.Join(dir, "*", "*.log"))
	for _, l := range logs {
		logOnFailure(t, "hub "+hub+" pod "+filepath.Base(filepath.Dir(l)), l)
	}
	if len(logs) == 0 {
		if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
			t.Logf("hub %s: the node stand-in ran no pod", hub)
		}
	}
}

// runningMessage is what CDI says in a DataVolume's Running condition: the importer's error.
func runningMessage(dv *cdiv1.DataVolume) string {
	for _, c := range dv.Status.Conditions {
		if c.Type == cdiv1.DataVolumeRunning {
			return c.Reason + ": " + c.Message
		}
	}
	return "no Running condition"
}
