package registry

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"

	"github.com/imagepipe/imagepipe/internal/need"
)

// TestImportFromEverySource imports the same disk from an HTTP URL (gzip
// wrapped, with --checksum), from MinIO over S3 (zstd wrapped) and from
// standard input; each image's disk equals the source. (Their source
// digests differ, since the bytes uploaded differ, and so do the images.)
func TestImportFromEverySource(t *testing.T) {
	testenv.RequireQEMU(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{})
	dir := t.TempDir()
	qcow := makeDisk(t, dir, 32, 4, "qcow2")
	testenv.Run(t, "sh", "-c", "gzip -k -c "+qcow+" > "+qcow+".gz && zstd -q -k -c "+qcow+" > "+qcow+".zst 2>/dev/null || true")
	if _, err := os.Stat(qcow + ".zst"); err != nil || fileSize(t, qcow+".zst") == 0 {
		need.Missing(t, "the zstd command (make tools installs the Debian package zstd)")
	}
	gzSum := "sha256:" + sha256File(t, qcow+".gz")

	srv := httptest.NewServer(http.FileServer(http.Dir(dir)))
	t.Cleanup(srv.Close)
	minio := harness.StartMinIO(t)
	minio.PutFile(t, "images", "tenants/acme/disk.qcow2.zst", qcow+".zst")

	importOK(t, t.TempDir(), srv.URL+"/"+filepath.Base(qcow)+".gz", reg.Host+"/acme/src:http", "--checksum", gzSum)
	r := testenv.RunCommand(t, testenv.Command{
		Name: testenv.Imagectl,
		Args: []string{"import", "--quiet", "-o", "json", "s3://images/tenants/acme/disk.qcow2.zst", reg.Host + "/acme/src:s3", "--s3-endpoint", "http://" + minio.Endpoint},
		Env:  []string{"IMAGEPIPE_CACHE=" + t.TempDir(), "AWS_ACCESS_KEY_ID=" + minio.AccessKey, "AWS_SECRET_ACCESS_KEY=" + minio.SecretKey, "AWS_REGION=us-east-1"},
	})
	if r.Code != 0 {
		t.Fatalf("s3 import: exit %d: %s", r.Code, r.Stderr)
	}
	in, err := os.ReadFile(qcow)
	if err != nil {
		t.Fatal(err)
	}
	viaStdin := testenv.RunCommand(t, testenv.Command{
		Name:  testenv.Imagectl,
		Args:  []string{"import", "--quiet", "-", reg.Host + "/acme/src:stdin"},
		Env:   []string{"IMAGEPIPE_CACHE=" + t.TempDir()},
		Stdin: string(in),
	})
	if viaStdin.Code != 0 {
		t.Fatalf("stdin import: exit %d: %s", viaStdin.Code, viaStdin.Stderr)
	}
	for _, tag := range []string{"http", "s3", "stdin"} {
		disk := pullWithSkopeo(t, reg.Host+"/acme/src:"+tag)
		testenv.Run(t, "qemu-img", "compare", "-q", qcow, disk)
	}

	bad := importCmd(t, t.TempDir(), srv.URL+"/"+filepath.Base(qcow)+".gz", reg.Host+"/acme/src:bad", "--checksum", "sha256:"+sha256Zero)
	if bad.Code == 0 {
		t.Error("import with a wrong --checksum succeeded")
	}
	if tags := reg.Tags(t, "acme/src"); strings.Join(tags, ",") != "http,s3,stdin" {
		t.Errorf("tags %v, want http, s3 and stdin only", tags)
	}
}
