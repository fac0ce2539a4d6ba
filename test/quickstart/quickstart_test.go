//go:build linux

package quickstart

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/util/retry"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// TestMain gives the test the image-syncer to run on the hub ($IMAGE_SYNCER
// when the Makefile built it, else a fresh build). imagectl is the one the
// README's own make build puts in bin/.
func TestMain(m *testing.M) { os.Exit(testenv.MainWithSyncer(m)) }

const (
	// section is the README's heading of the quick start.
	section = "## Quick start"
	// marker tells readers of the README's source that the section is
	// run; the test refuses a section without it.
	marker = "<!-- test/quickstart runs every ```sh block of this section, in order, as one bash script. -->"
	// sshKey is the public key the quick start passes to vm create as
	// ~/.ssh/id_ed25519.pub.
	sshKey = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBlU3pg8jG2C5zN7D3YtKo0Yc7U5m1Q0bGm0b8dQ1x4G quickstart@example.com\n"
	// runTimeout bounds the whole quick start; its own waits are shorter.
	runTimeout = 8 * time.Minute
)

// TestREADMEQuickStartRunsAsWritten runs the README's quick start with
// bash in the repository's root, as a reader who set REGISTRY and
// KUBECONFIG as it says: REGISTRY is a real distribution registry whose
// notifications reach image-syncer, KUBECONFIG the tenant's account on a
// hub with image-syncer, CDI's real controller and importer, and
// config/tenant's RBAC in namespace acme; HOME is a fresh directory
// holding the SSH key the README names, TMPDIR one of the test's. KubeVirt's controllers do not run
// here, so the test plays virt-controller once the VM exists: the
// instance runs and the VM is reported Ready, which vm create --wait waits
// for. Any command of the README that fails fails the test; afterwards the
// VM must exist as the README asked for it, booting from the image the
// README imported.
func TestREADMEQuickStartRunsAsWritten(t *testing.T) {
	testenv.RequireQEMU(t)
	kubectl := harness.Binary(t, "kubectl")
	root := harness.RepoRoot(t)
	script := quickStart(t, filepath.Join(root, "README.md"))

	hub := harness.StartSyncerHub(t, "hub-quickstart", harness.SyncerHubOptions{Namespaces: []string{"acme"}})
	hub.BindTenant(t, "tenant-a", "acme")
	syncer := harness.ReserveSyncer(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{Gate: testenv.ImageGate, NotifyURL: syncer.WebhookURL, NotifyToken: harness.SyncerWebhookToken})
	hub.CDI.AllowInsecureRegistry(t, reg.Host)
	syncer.Start(t, testenv.ImageSyncer, hub, reg.Host)

	home := t.TempDir()
	if err := os.MkdirAll(filepath.Join(home, ".ssh"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(home, ".ssh", "id_ed25519.pub"), []byte(sshKey), 0o644); err != nil {
		t.Fatal(err)
	}
	env := readerEnv(t, home, map[string]string{
		"REGISTRY":   reg.Host,
		"KUBECONFIG": hub.UserKubeconfig(t, "tenant-a"),
		// mktemp's directory, where the quick start makes its disk.
		"TMPDIR": t.TempDir(),
		// kubectl, as a reader has it.
		"PATH": filepath.Dir(kubectl) + string(os.PathListSeparator) + os.Getenv("PATH"),
	})

	ctx, cancel := context.WithTimeout(t.Context(), runTimeout)
	defer cancel()
	played := playVirtController(ctx, t, hub.Client, client.ObjectKey{Namespace: "acme", Name: "web"})
	out, err := runScript(ctx, root, env, script)
	cancel()
	<-played
	if err != nil {
		t.Fatalf("the README's quick start failed: %v\n%s", err, out)
	}
	t.Logf("the README's quick start:\n%s", out)

	var bi v1alpha1.BaseImage
	if err := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: "acme", Name: "demo--1"}, &bi); err != nil {
		t.Fatal(err)
	}
	var vm kubevirtv1.VirtualMachine
	if err := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: "acme", Name: "web"}, &vm); err != nil {
		t.Fatalf("the quick start's VM: %v", err)
	}
	if len(vm.Spec.DataVolumeTemplates) != 1 || vm.Spec.DataVolumeTemplates[0].Spec.SourceRef == nil ||
		vm.Spec.DataVolumeTemplates[0].Spec.SourceRef.Name != bi.Status.DataSourceName || bi.Status.ImportedDigest == "" ||
		vm.Annotations["imagepipe.io/image-digest"] != bi.Status.ImportedDigest {
		t.Errorf("VM web does not boot from the imported image: data volume templates %+v, annotations %v; BaseImage status %+v",
			vm.Spec.DataVolumeTemplates, vm.Annotations, bi.Status)
	}
	if cpu := vm.Spec.Template.Spec.Domain.CPU; cpu == nil || cpu.Cores != 4 || vm.Labels["imagepipe.io/template"] != "linux_server" {
		t.Errorf("VM web: CPU %+v, labels %v; want the linux_server template with cpu_cores=4", cpu, vm.Labels)
	}
	if !strings.Contains(out, "virtualmachine acme/web is Running on node node-quickstart") {
		t.Errorf("vm create --wait did not end with the VM running")
	}
}

// quickStart returns the sh blocks of the README's quick start, in order,
// as one script. The section must carry the marker, have blocks, use
// $REGISTRY and name no example host, which the test could not stand in
// for; a bash or shell block, which it would skip, is refused.
func quickStart(t *testing.T, readme string) string {
	t.Helper()
	data, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	var script strings.Builder
	in, marked, blocks, open := false, false, 0, false
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case open && line == "```":
			open = false
		case open:
			script.WriteString(line + "\n")
		case line == section:
			in = true
		case in && strings.HasPrefix(line, "## "):
			in = false
		case in && line == marker:
			marked = true
		case in && line == "```sh":
			open, blocks = true, blocks+1
			fmt.Fprintf(&script, "# README.md:%d\n", n+1)
		case in && (line == "```bash" || line == "```shell"):
			// Commands a reader would run, which this test would skip.
			t.Fatalf("%s:%d: %s block in %q; mark the quick start's commands ```sh, which this test runs (```console for examples not to run)", readme, n, line, section)
		}
	}
	switch s := script.String(); {
	case open:
		t.Fatalf("%s: a ```sh block of %q is not closed", readme, section)
	case !marked:
		t.Fatalf("%s: section %q lacks the line %s", readme, section, marker)
	case blocks == 0:
		t.Fatalf("%s: section %q has no ```sh block", readme, section)
	case !strings.Contains(s, "$REGISTRY"):
		t.Fatalf("%s: the quick start does not use $REGISTRY:\n%s", readme, s)
	case strings.Contains(s, "example.com"):
		t.Fatalf("%s: the quick start names an example host instead of $REGISTRY:\n%s", readme, s)
	}
	return script.String()
}

// readerEnv is the environment of a reader of the README: the test's,
// with HOME a fresh directory (no docker credentials, kubeconfig or
// imagectl cache of the machine's user), Go's caches where they are (make
// build needs them), nothing of imagectl's set, and the variables given.
func readerEnv(t *testing.T, home string, set map[string]string) []string {
	t.Helper()
	goEnv, err := exec.Command("go", "env", "GOCACHE", "GOMODCACHE", "GOPATH", "GOENV").Output()
	if err != nil {
		t.Fatalf("go env: %v", err)
	}
	vals := strings.Split(strings.TrimSpace(string(goEnv)), "\n")
	if len(vals) != 4 {
		t.Fatalf("go env printed %q", goEnv)
	}
	set["GOCACHE"], set["GOMODCACHE"], set["GOPATH"], set["GOENV"] = vals[0], vals[1], vals[2], vals[3]
	set["HOME"] = home
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if _, ok := set[k]; ok || strings.HasPrefix(k, "IMAGEPIPE_") || k == "DOCKER_CONFIG" || k == "IMAGECTL" || k == "IMAGE_SYNCER" {
			continue
		}
		env = append(env, kv)
	}
	for k, v := range set {
		env = append(env, k+"="+v)
	}
	return env
}

// runScript runs script with bash -euxo pipefail in dir, and returns what
// it printed, the commands traced among it. When ctx ends, bash and every
// process it started are killed.
func runScript(ctx context.Context, dir string, env []string, script string) (string, error) {
	cmd := exec.CommandContext(ctx, "bash", "-euxo", "pipefail", "-c", script)
	cmd.Dir, cmd.Env = dir, env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// A group of its own, killed as one; and bash dies with the test
	// binary if that ends without cleaning up (a timeout's panic).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	err := cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("%w (%v)", err, context.Cause(ctx))
	}
	return out.String(), err
}

// playVirtController plays KubeVirt's virt-controller and virt-handler,
// which do not run here, for the VM key: once it exists, its instance runs
// on node node-quickstart with an address, and the VM is reported Ready
// through its status subresource. It stops when ctx ends; the channel is
// closed then.
func playVirtController(ctx context.Context, t *testing.T, c client.Client, key client.ObjectKey) <-chan struct{} {
	done := make(chan struct{})
	var once sync.Once
	fail := func(err error) { once.Do(func() { t.Errorf("playing virt-controller for VM %s: %v", key, err) }) }
	go func() {
		defer close(done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			var vm kubevirtv1.VirtualMachine
			err := c.Get(ctx, key, &vm)
			if apierrors.IsNotFound(err) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				continue
			}
			if err != nil {
				fail(err)
				return
			}
			vmi := harness.RunningInstance(&vm, "node-quickstart", "10.0.0.7", true)
			if err := c.Create(ctx, vmi); err != nil {
				fail(fmt.Errorf("creating its instance: %w", err))
				return
			}
			err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
				if err := c.Get(ctx, key, &vm); err != nil {
					return err
				}
				vm.Status = harness.RunningVMStatus()
				return c.Status().Update(ctx, &vm)
			})
			if err != nil {
				fail(fmt.Errorf("reporting it ready: %w", err))
			}
			return
		}
	}()
	return done
}
