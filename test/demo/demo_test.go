package main

import (
	"os"
	"testing"

	"github.com/imagepipe/imagepipe/test/testenv"
)

// TestMain builds imagectl and image-syncer unless the Makefile built
// them ($IMAGECTL, $IMAGE_SYNCER).
func TestMain(m *testing.M) { os.Exit(testenv.MainWithSyncer(m)) }

// TestDemo runs `make demo`'s tour in its short mode (a 32 MiB sample disk), so that CI
// catches the demo rotting. The tour checks every outcome it shows and fails otherwise: the
// BaseImage importing on both hubs with a digest-pinned ReadWriteMany DataVolume; Ready, with
// the DataSource serving the import, once CDI's real importer has filled the volume with exactly
// the uploaded disk (qemu-img compare); the VM created by the tenant cloning that DataSource;
// the DataSource switched to a new version only after its import succeeded; retention (hub-1
// keeps two imports, hub-2 one); the deletion policies (hub-1 retains with phase Deleted, hub-2
// removes everything); and that no process it started is left once it ends. Its output is shown
// with go test -v.
func TestDemo(t *testing.T) {
	testenv.RequireQEMU(t)
	runDemo(t, config{imagectl: testenv.Imagectl, syncer: testenv.ImageSyncer, gate: testenv.ImageGate})
}
