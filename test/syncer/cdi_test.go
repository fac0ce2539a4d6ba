package syncer

import (
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/imagepipe/imagepipe/internal/cdi"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// importTimeout bounds one real import by CDI: the controller's 2-second requeues, the node
// stand-in's provisioning (mkfs.ext4 for the scratch claim), and the importer's pull and
// conversion, on a loaded 2-core machine.
const importTimeout = 4 * time.Minute

// TestRealCDIImportsEveryDiskAndLayerCompression pushes a qcow2 and a raw disk, each with gzip,
// zstd and uncompressed layers, lets the syncer replicate them, and has CDI's real controller
// and importer (v1.64.0, its pods run by the node stand-in) import each into a ReadWriteMany
// Block volume. Every BaseImage turns Ready on CDI's own status, and every volume holds exactly
// the source disk (qemu-img compare). The zstd cases are the ones released CDI used to fail
// ("window size exceeded", kubevirt/containerized-data-importer#4277). An empty 1 GiB qcow2 and
// an empty 1 GiB raw disk (stored as qcow2) make gzip layers that compress to under the 512
// bytes CDI reads before it knows the format ("could not process image header: unexpected
// EOF"); imagectl pads them, and they are imported like the others, as are their zstd layers.
func TestRealCDIImportsEveryDiskAndLayerCompression(t *testing.T) {
	t.Parallel()
	testenv.RequireQEMU(t)
	hub := startTestHub(t, "hub-a")
	s := harness.ReserveSyncer(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{Gate: testenv.ImageGate, NotifyURL: s.WebhookURL, NotifyToken: webhookToken})
	startSyncer(t, s, hub, reg.Host, "--poll-interval", "1h")

	raw := sparseDisk(t)
	qcow2 := filepath.Join(t.TempDir(), "disk.qcow2")
	testenv.Run(t, "qemu-img", "convert", "-q", "-f", "raw", "-O", "qcow2", raw, qcow2)
	emptyQCOW2 := filepath.Join(t.TempDir(), "empty.qcow2")
	testenv.Run(t, "qemu-img", "create", "-q", "-f", "qcow2", emptyQCOW2, "1G")
	emptyRaw := filepath.Join(t.TempDir(), "empty.raw")
	testenv.Run(t, "qemu-img", "create", "-q", "-f", "raw", emptyRaw, "1G")
	type push struct{ image, dv, source, format string }
	var pushes []push
	for _, disk := range []struct {
		name, format, path string
		comps              []string
	}{
		{"qcow2", "qcow2", qcow2, []string{"gzip", "zstd", "none"}},
		{"raw", "raw", raw, []string{"gzip", "zstd", "none"}},
		{"empty-qcow2", "qcow2", emptyQCOW2, []string{"gzip", "zstd"}},
		{"empty-raw", "raw", emptyRaw, []string{"gzip", "zstd"}},
	} {
		for _, comp := range disk.comps {
			image := "disk-" + disk.name + "-" + comp
			res := importImageWith(t, "", disk.path, reg.Host+"/acme/"+image+":1", "--compression", comp)
			if strings.HasPrefix(disk.name, "empty") && comp == "gzip" && res.LayerSize >= 1024 {
				t.Fatalf("%s: the layer is %d bytes; the test needs one as small as an empty disk's", image, res.LayerSize)
			}
			pushes = append(pushes, push{image, cdi.DataVolumeName(image, res.Digest), disk.path, disk.format})
		}
	}
	for _, p := range pushes {
		t.Run(p.image, func(t *testing.T) {
			hub.CDI.WaitImported(t, "acme", p.dv, importTimeout)
			bi := hub.baseImage(t, "acme", p.image+"--1", "ready", func(b *v1alpha1.BaseImage) bool {
				return b.Status.Phase == v1alpha1.PhaseReady && meta.IsStatusConditionTrue(b.Status.Conditions, v1alpha1.ConditionReady)
			})
			if bi.Status.DataSourceName == "" {
				t.Fatalf("BaseImage Ready without a DataSource: %+v", bi.Status)
			}
			// CDI's own DataSource controller finds the imported claim and marks the DataSource Ready.
			harness.WaitUntil(t, "CDI marks DataSource "+bi.Status.DataSourceName+" Ready", time.Minute, 200*time.Millisecond, func() (bool, error) {
				var ds cdiv1.DataSource
				if err := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: "acme", Name: bi.Status.DataSourceName}, &ds); err != nil {
					return false, err
				}
				for _, c := range ds.Status.Conditions {
					if c.Type == cdiv1.DataSourceReady && c.Status == corev1.ConditionTrue {
						return true, nil
					}
				}
				return false, nil
			})
			got := filepath.Join(t.TempDir(), "imported.raw")
			hub.CDI.CopyImportedDisk(t, "acme", p.dv, got)
			testenv.Run(t, "qemu-img", "compare", "-q", "-f", p.format, "-F", "raw", p.source, got)
		})
	}
}

// sparseDisk writes a 64 MiB raw disk with random data in a few places and holes between, so
// that every layer compression and the qcow2 conversion have real work, and a wrong byte shows.
func sparseDisk(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "disk.raw")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 300<<10)
	for _, off := range []int64{0, 5 << 20, 17<<20 + 4096, 63 << 20} {
		if _, err := rand.Read(chunk); err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt(chunk, off); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Truncate(64 << 20); err != nil {
		t.Fatal(err)
	}
	return path
}
