package guest

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/imagepipe/imagepipe/internal/bootcheck"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// debianUser is the user Debian's cloud-init creates (its cloud.cfg's
// default_user), to whom it gives the meta-data's public keys.
const debianUser = "debian"

// bootDeadline bounds a Debian guest's boot to SSH under TCG on a busy
// 2-core machine: 1m18s measured on a quiet one, 3m12s beside three
// processes spinning.
const bootDeadline = 15 * time.Minute

// TestTenantLogsInWithTheKeyVMCreateGave: `imagectl vm create --ssh-key`
// with the provider's linux_server template makes a VirtualMachine on a
// real kube-apiserver; the NoCloud seed KubeVirt would make of it is given
// to a real Debian guest booted in QEMU, and the tenant logs in over SSH
// with the private half of the key they gave, while another key is
// refused. Its cloud-init and OpenSSH are Debian's own.
func TestTenantLogsInWithTheKeyVMCreateGave(t *testing.T) {
	dir := guests(t)
	disk := filepath.Join(dir, "debian.raw")
	accel := accelerator(t, dir)

	// The tenant's key pair, and one that is not theirs.
	tenantKey, tenantPub := newKey(t)
	otherKey, _ := newKey(t)
	work := t.TempDir()
	pubFile := filepath.Join(work, "id_ed25519.pub")
	if err := os.WriteFile(pubFile, ssh.MarshalAuthorizedKey(tenantPub), 0o644); err != nil {
		t.Fatal(err)
	}

	// A hub where image-syncer has synced acme/debian:12.
	hub := harness.StartHub(t, "guest", filepath.Join(harness.RepoRoot(t), "config", "crd"))
	c, err := client.New(hub.RestConfig, client.Options{Scheme: harness.NewScheme(t)})
	if err != nil {
		t.Fatal(err)
	}
	block := corev1.PersistentVolumeBlock
	for _, o := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "acme"}},
		&storagev1.StorageClass{
			ObjectMeta:  metav1.ObjectMeta{Name: "shared", Annotations: map[string]string{"storageclass.kubernetes.io/is-default-class": "true"}},
			Provisioner: "example.com/shared",
		},
		&cdiv1.StorageProfile{ObjectMeta: metav1.ObjectMeta{Name: "shared"}, Spec: cdiv1.StorageProfileSpec{ClaimPropertySets: []cdiv1.ClaimPropertySet{
			{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}, VolumeMode: &block},
		}}},
	} {
		if err := c.Create(t.Context(), o); err != nil {
			t.Fatalf("creating %T %s: %v", o, o.GetName(), err)
		}
	}
	bi := &v1alpha1.BaseImage{
		ObjectMeta: metav1.ObjectMeta{Name: "debian--12", Namespace: "acme"},
		Spec:       v1alpha1.BaseImageSpec{Tenant: "acme", Repository: "registry.example.com/acme/debian", Tag: "12"},
	}
	if err := c.Create(t.Context(), bi); err != nil {
		t.Fatal(err)
	}
	bi.Status = v1alpha1.BaseImageStatus{Phase: v1alpha1.PhaseReady, ImportedDigest: "sha256:" + strings.Repeat("ab", 32), DataSourceName: "debian--12"}
	if err := c.Status().Update(t.Context(), bi); err != nil {
		t.Fatal(err)
	}

	// The tenant creates the VM as the quick start says.
	template := filepath.Join(harness.RepoRoot(t), "templates", "linux-server.yaml")
	testenv.RunImagectlOK(t, "vm", "create", "debian", "--image", "acme/debian:12", "--template-file", template,
		"--set", "memory=1Gi", "--ssh-key", pubFile, "--kubeconfig", hub.Kubeconfig, "-n", "acme")
	var vm kubevirtv1.VirtualMachine
	if err := c.Get(t.Context(), client.ObjectKey{Namespace: "acme", Name: "debian"}, &vm); err != nil {
		t.Fatalf("reading the VM vm create made: %v", err)
	}
	seed := noCloudSeed(t, c, &vm)

	port := harness.FreePort(t)
	start := time.Now()
	m := boot(t, machineSpec{disk: disk, seed: seed, uuid: firmwareUUID(&vm), sshPort: port, memMiB: 1024, accel: accel, agent: true})
	ctx, cancel := context.WithTimeout(t.Context(), bootDeadline)
	defer cancel()

	// cloud-init prints the host keys it made on the console: the SSH
	// client trusts those only.
	hostKeys := waitHostKeys(t, ctx, m)
	t.Logf("cloud-init printed %d host keys %s after QEMU started", len(hostKeys), time.Since(start).Round(time.Second))
	addr := net.JoinHostPort("127.0.0.1", fmt.Sprint(port))
	out := sshRun(t, ctx, m, addr, tenantKey, hostKeys, "id -un; cat ~/.ssh/authorized_keys")
	t.Logf("logged in as the tenant %s after QEMU started (%s)", time.Since(start).Round(time.Second), accel)
	if lines := strings.SplitN(out, "\n", 2); lines[0] != debianUser || !strings.Contains(out, strings.TrimSpace(string(ssh.MarshalAuthorizedKey(tenantPub)))) {
		t.Errorf("the tenant's session says:\n%s\nwant user %s with the tenant's key in authorized_keys", out, debianUser)
	}

	// Another key is refused by the same server.
	if _, err := dialSSH(ctx, addr, otherKey, hostKeys); err == nil || !strings.Contains(err.Error(), "unable to authenticate") {
		t.Errorf("logging in with a key the tenant did not give: %v; want it refused", err)
	}

	// The guest's QEMU guest agent answers on the port KubeVirt gives every
	// VM: what KubeVirt's AgentConnected condition and `virtctl guestosinfo`
	// read.
	if err := bootcheck.WaitAgent(ctx, m.agent); err != nil {
		t.Fatalf("waiting for the guest agent: %v; the console's last line: %s", err, m.console.last())
	}
	t.Logf("the guest agent answered %s after QEMU started", time.Since(start).Round(time.Second))
}

func newKey(t *testing.T) (ssh.Signer, ssh.PublicKey) {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return signer, signer.PublicKey()
}

// waitHostKeys waits for cloud-init's "BEGIN SSH HOST KEY KEYS" block on
// the console and returns the keys in it.
func waitHostKeys(t *testing.T, ctx context.Context, m *machine) []ssh.PublicKey {
	t.Helper()
	var keys []ssh.PublicKey
	err := m.console.waitFor(ctx, func(lines []string) bool {
		in := false
		for _, l := range lines {
			switch {
			case strings.Contains(l, "-----BEGIN SSH HOST KEY KEYS-----"):
				in, keys = true, nil
			case strings.Contains(l, "-----END SSH HOST KEY KEYS-----"):
				if in && len(keys) > 0 {
					return true
				}
				in = false
			case in:
				// A key line, perhaps after kernel messages on the same line.
				if i := strings.Index(l, "ssh-"); i >= 0 {
					if k, _, _, _, err := ssh.ParseAuthorizedKey([]byte(l[i:])); err == nil {
						keys = append(keys, k)
					}
				}
			}
		}
		return false
	})
	if err != nil {
		t.Fatalf("waiting for cloud-init's SSH host keys on the serial console: %v after %s; its last line: %s",
			err, time.Since(m.started).Round(time.Second), m.console.last())
	}
	return keys
}

// dialSSH logs in as debianUser with key, trusting only hostKeys.
func dialSSH(ctx context.Context, addr string, key ssh.Signer, hostKeys []ssh.PublicKey) (*ssh.Client, error) {
	config := &ssh.ClientConfig{
		User: debianUser,
		Auth: []ssh.AuthMethod{ssh.PublicKeys(key)},
		HostKeyCallback: func(_ string, _ net.Addr, key ssh.PublicKey) error {
			for _, k := range hostKeys {
				if bytes.Equal(k.Marshal(), key.Marshal()) {
					return nil
				}
			}
			return errors.New("the host key is not one cloud-init printed")
		},
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	// Under TCG a handshake is slow, but not this slow.
	_ = conn.SetDeadline(time.Now().Add(90 * time.Second))
	c, chans, reqs, err := ssh.NewClientConn(conn, addr, config)
	if err != nil {
		conn.Close()
		return nil, err
	}
	_ = conn.SetDeadline(time.Time{})
	return ssh.NewClient(c, chans, reqs), nil
}

// sshRun logs in with key, retrying while the guest's sshd is not up yet
// (the connection refused or reset), and runs cmd.
func sshRun(t *testing.T, ctx context.Context, m *machine, addr string, key ssh.Signer, hostKeys []ssh.PublicKey, cmd string) string {
	t.Helper()
	for {
		c, err := dialSSH(ctx, addr, key, hostKeys)
		if err == nil {
			defer c.Close()
			s, err := c.NewSession()
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			out, err := s.CombinedOutput(cmd)
			if err != nil {
				t.Fatalf("ssh %s %q: %v\n%s", addr, cmd, err, out)
			}
			return strings.TrimSpace(string(out))
		}
		if strings.Contains(err.Error(), "unable to authenticate") || strings.Contains(err.Error(), "host key") {
			t.Fatalf("logging in with the tenant's key: %v", err)
		}
		if done, qerr := m.exited(); done {
			t.Fatalf("QEMU exited before SSH answered (%v); last error %v", qerr, err)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no SSH login within %s: %v; the console's last line: %s", bootDeadline, err, m.console.last())
		case <-time.After(time.Second):
		}
	}
}
