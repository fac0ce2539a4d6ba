package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/imagepipe/imagepipe/test/testenv"
)

// syncerBin is the image-syncer binary the test runs: $IMAGE_SYNCER when the Makefile built
// it, else a fresh build. testenv.Main does the same for imagectl ($IMAGECTL).
var syncerBin string

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
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := testenv.Main(m)
	os.RemoveAll(dir)
	os.Exit(code)
}

// TestDemo runs `make demo`'s tour in its short mode (a 32 MiB sample disk), so that CI
// catches the demo rotting. The tour checks every outcome it shows and fails otherwise: the
// BaseImage importing on both hubs with a digest-pinned ReadWriteMany DataVolume, Ready with
// the DataSource serving the import once the CDI stand-in marked it Succeeded, the VM created
// by the tenant cloning that DataSource, the DataSource switched to a new version only after
// its import succeeded, retention (hub-1 keeps two imports, hub-2 one), the deletion policies
// (hub-1 retains with phase Deleted, hub-2 removes everything), and that no process it started
// is left once it ends. Its output is shown with go test -v.
func TestDemo(t *testing.T) {
	testenv.RequireQEMU(t)
	runDemo(t, config{imagectl: testenv.Imagectl, syncer: syncerBin})
}
