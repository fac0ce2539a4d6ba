package syncer

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"

	"github.com/imagepipe/imagepipe/internal/need"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// registryName is the DNS name of the registry in
// TestAPlainHTTPRegistryByName: not localhost and not an address, so
// go-containerregistry would use HTTPS for it unless told otherwise.
const registryName = "registry.test"

// TestAPlainHTTPRegistryByName: a provider whose registry speaks plain
// HTTP under a DNS name sets --registry-insecure on the gate and the
// syncer, and an image goes through both; without the flag the server
// side speaks only HTTPS to that name and says which flag allows HTTP.
// The gate and the syncer run in a mount namespace whose /etc/hosts maps
// registryName to 127.0.0.1 (hostsWrapper).
func TestAPlainHTTPRegistryByName(t *testing.T) {
	t.Parallel()
	need.Root(t, "the gate and the syncer see a hosts file of the test in a mount namespace")
	need.Program(t, "unshare")
	need.Program(t, "mount")
	testenv.RequireQEMU(t)
	hub := startAPIHub(t, "hub-a")
	syncer := harness.ReserveSyncer(t)
	gate := harness.ReserveGate(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{NotifyURL: syncer.WebhookURL, NotifyURLs: []string{gate.WebhookURL}, NotifyToken: webhookToken})
	_, port, _ := strings.Cut(reg.Host, ":")
	host := registryName + ":" + port
	gateBin, syncerBin := hostsWrapper(t, testenv.ImageGate), hostsWrapper(t, testenv.ImageSyncer)

	res := importImage(t, rawDisk(t, "plain HTTP by name"), reg.Host+"/acme/rhel:1")

	// Without --registry-insecure: HTTPS only, since the name is not a
	// loopback one, and an error that names the flag.
	r := testenv.RunCommand(t, testenv.Command{Name: gateBin, Args: []string{"verify-one", "--registry", host}, Stdin: host + "/acme/rhel@" + res.Digest + "\n"})
	if r.Code == 0 || !strings.Contains(r.Stderr, "the registry speaks plain HTTP, not HTTPS") {
		t.Errorf("image-gate verify-one without --registry-insecure: exit %d, want HTTPS only, naming the flag, to %s\n%s", r.Code, host, r.Stderr)
	}

	gate.Start(t, gateBin, host, "", "", "", "--registry-insecure")
	syncer.Start(t, syncerBin, hub.SyncerHub, host, "--registry-insecure", "--poll-interval", "1h")
	var dv cdiv1.DataVolume
	waitFor(t, "the DataVolume of "+res.Digest, func() (bool, error) {
		err := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: "acme", Name: dvName(res.Digest)}, &dv)
		return err == nil, client.IgnoreNotFound(err)
	})
	if src := dv.Spec.Source; src == nil || src.Registry == nil || src.Registry.URL == nil || !strings.HasPrefix(*src.Registry.URL, "docker://"+host+"/acme/rhel@sha256:") {
		t.Errorf("DataVolume source %+v, want an image by digest on %s", dv.Spec.Source, host)
	}
}

// hostsWrapper returns a script that runs bin in a mount namespace of its
// own where /etc/hosts maps registryName to 127.0.0.1. The script ends
// in exec, so bin keeps its process ID and receives the harness's signals.
func hostsWrapper(t *testing.T, bin string) string {
	t.Helper()
	dir := t.TempDir()
	hosts := filepath.Join(dir, "hosts")
	if err := os.WriteFile(hosts, []byte("127.0.0.1 localhost "+registryName+"\n::1 localhost\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(dir, filepath.Base(bin))
	body := "#!/bin/sh\nexec unshare -m sh -c 'mount --bind \"$0\" /etc/hosts && exec \"$@\"' " + hosts + " " + bin + " \"$@\"\n"
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	return script
}
