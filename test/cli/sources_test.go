package cli

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"

	"github.com/imagepipe/imagepipe/internal/need"
)

// TestTLSFlagsApplyToSources: an https:// source whose certificate a
// private CA signs is refused, with a hint naming --ca-file, until
// --ca-file names that CA or --insecure skips the check; for inspect,
// convert and import alike, import's registry keeping its own rule.
func TestTLSFlagsApplyToSources(t *testing.T) {
	testenv.RequireQEMU(t)
	dir := t.TempDir()
	disk := validQCOW2(t, dir, false)
	testenv.Run(t, "gzip", "-k", disk)
	srv := harness.StartHTTPS(t, http.FileServer(http.Dir(dir)))
	reg := harness.StartRegistry(t, harness.RegistryOptions{})
	cfg := t.TempDir()

	for _, src := range []string{srv.URL + "/disk.qcow2", srv.URL + "/disk.qcow2.gz"} {
		for _, cmd := range [][]string{
			{"inspect", src},
			{"convert", src, filepath.Join(dir, "out.qcow2")},
			{"import", "--quiet", src, reg.Host + "/acme/disk:" + filepath.Ext(src)[1:]},
		} {
			t.Run(cmd[0]+"/"+filepath.Base(src), func(t *testing.T) {
				r := imagectl(t, cfg, "", cmd...)
				if r.Code != 1 || !strings.Contains(r.Stderr, "certificate signed by unknown authority") || !strings.Contains(r.Stderr, "--ca-file") {
					t.Errorf("without --ca-file: exit %d\n%s", r.Code, r.Stderr)
				}
				for _, flags := range [][]string{{"--ca-file", srv.CAFile}, {"--insecure"}} {
					if r := imagectl(t, cfg, "", append(cmd, flags...)...); r.Code != 0 {
						t.Errorf("with %s: exit %d\n%s", flags[0], r.Code, r.Stderr)
					}
				}
			})
		}
	}
	// The CA of another server is no help.
	other := harness.StartHTTPS(t, http.NotFoundHandler())
	if r := imagectl(t, cfg, "", "inspect", srv.URL+"/disk.qcow2", "--ca-file", other.CAFile); r.Code != 1 {
		t.Errorf("with another server's CA: exit %d\n%s", r.Code, r.Stderr)
	}
	if r := imagectl(t, cfg, "", "inspect", srv.URL+"/disk.qcow2", "--ca-file", disk); r.Code != 1 || !strings.Contains(r.Stderr, "no PEM certificates") {
		t.Errorf("with a CA file that is no PEM: exit %d\n%s", r.Code, r.Stderr)
	}
}

// TestS3EndpointSchemeAndTLS: --s3-endpoint http://HOST:PORT speaks plain
// HTTP without --s3-insecure, https:// to a plain-HTTP server fails, and a
// MinIO serving HTTPS with a private CA is read with --ca-file or
// --insecure, and refused without.
func TestS3EndpointSchemeAndTLS(t *testing.T) {
	testenv.RequireQEMU(t)
	disk := validQCOW2(t, t.TempDir(), false)
	plain := harness.StartMinIO(t)
	plain.PutFile(t, "images", "disk.qcow2", disk)
	secure := harness.StartMinIOWith(t, harness.MinIOOptions{TLS: true})
	secure.PutFile(t, "images", "disk.qcow2", disk)
	cfg := t.TempDir()
	run := func(m *harness.MinIO, args ...string) testenv.Result {
		t.Helper()
		return testenv.RunCommand(t, testenv.Command{
			Name: testenv.Imagectl,
			Args: append([]string{"inspect", "s3://images/disk.qcow2"}, args...),
			Env: []string{"DOCKER_CONFIG=" + cfg, "AWS_ACCESS_KEY_ID=" + m.AccessKey, "AWS_SECRET_ACCESS_KEY=" + m.SecretKey,
				"AWS_REGION=us-east-1", "AWS_ENDPOINT_URL=", "AWS_ENDPOINT_URL_S3="},
		})
	}
	for _, tc := range []struct {
		m    *harness.MinIO
		args []string
		ok   bool
	}{
		{plain, []string{"--s3-endpoint", "http://" + plain.Endpoint}, true},
		{plain, []string{"--s3-endpoint", plain.Endpoint, "--s3-insecure"}, true},
		{plain, []string{"--s3-endpoint", "https://" + plain.Endpoint}, false},
		{plain, []string{"--s3-endpoint", "https://" + plain.Endpoint, "--s3-insecure"}, false},
		{secure, []string{"--s3-endpoint", "https://" + secure.Endpoint}, false},
		{secure, []string{"--s3-endpoint", "https://" + secure.Endpoint, "--ca-file", secure.CAFile}, true},
		{secure, []string{"--s3-endpoint", secure.Endpoint, "--ca-file", secure.CAFile}, true},
		{secure, []string{"--s3-endpoint", "https://" + secure.Endpoint, "--insecure"}, true},
		{secure, []string{"--s3-endpoint", "http://" + secure.Endpoint}, false},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			r := run(tc.m, tc.args...)
			if ok := r.Code == 0; ok != tc.ok {
				t.Errorf("exit %d, want success %v\n%s%s", r.Code, tc.ok, r.Stdout, r.Stderr)
			}
			if tc.ok && !strings.Contains(r.Stdout, "accepted") {
				t.Errorf("no verdict:\n%s", r.Stdout)
			}
		})
	}
}

// TestCompressedSourcesWholeOrRejected: gzip-, zstd- and xz-compressed
// files convert to the disk they hold (qemu-img compares), and the same
// files cut short are rejected with exit 3, leaving no output.
func TestCompressedSourcesWholeOrRejected(t *testing.T) {
	testenv.RequireQEMU(t)
	dir := t.TempDir()
	disk := validQCOW2(t, dir, false)
	for _, tool := range []string{"gzip", "zstd", "xz"} {
		t.Run(tool, func(t *testing.T) {
			need.Program(t, tool)
			packed := filepath.Join(dir, "disk.qcow2."+tool)
			testenv.Run(t, "sh", "-c", tool+" -c "+disk+" > "+packed)
			out := filepath.Join(dir, tool+".qcow2")
			if code, _, stderr := testenv.Exit(t, testenv.Imagectl, "convert", packed, out); code != 0 {
				t.Fatalf("convert: exit %d\n%s", code, stderr)
			}
			testenv.Run(t, "qemu-img", "compare", "-q", disk, out)

			data, err := os.ReadFile(packed)
			if err != nil {
				t.Fatal(err)
			}
			cut := filepath.Join(dir, "cut."+tool)
			if err := os.WriteFile(cut, data[:len(data)*3/4], 0o644); err != nil {
				t.Fatal(err)
			}
			cutOut := filepath.Join(dir, "cut-"+tool+".qcow2")
			code, _, stderr := testenv.Exit(t, testenv.Imagectl, "convert", cut, cutOut)
			if code != 3 || !strings.Contains(stderr, "invalid-wrapper") {
				t.Errorf("a truncated %s file: exit %d, want 3 (invalid-wrapper)\n%s", tool, code, stderr)
			}
			if _, err := os.Stat(cutOut); !os.IsNotExist(err) {
				t.Errorf("output left behind: %v", err)
			}
		})
	}
}
