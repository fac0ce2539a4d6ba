package registry

import (
	"archive/tar"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/imagepipe/imagepipe/pkg/api"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"

	"github.com/imagepipe/imagepipe/internal/need"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// importCmd runs imagectl import with its own cache directory (digest cache
// and upload state files), so tests do not share state.
func importCmd(t *testing.T, cache string, args ...string) testenv.Result {
	t.Helper()
	return testenv.RunCommand(t, testenv.Command{
		Name: testenv.Imagectl,
		Args: append([]string{"import", "--quiet", "-o", "json"}, args...),
		Env:  []string{"IMAGEPIPE_CACHE=" + cache},
	})
}

func importOK(t *testing.T, cache string, args ...string) api.ImportResult {
	t.Helper()
	r := importCmd(t, cache, args...)
	if r.Code != 0 {
		t.Fatalf("imagectl import %v: exit %d\n%s", args, r.Code, r.Stderr)
	}
	var res api.ImportResult
	if err := json.Unmarshal([]byte(r.Stdout), &res); err != nil {
		t.Fatalf("import output %q: %v", r.Stdout, err)
	}
	return res
}

// makeDisk writes a raw disk of sizeMiB with nMiB of random data spread
// over it, and converts it to qcow2 when asked.
func makeDisk(t *testing.T, dir string, sizeMiB, nMiB int, format string) string {
	t.Helper()
	raw := filepath.Join(dir, "disk.raw")
	f, err := os.Create(raw)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(int64(sizeMiB) << 20); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(uint64(sizeMiB), uint64(nMiB)))
	buf := make([]byte, 1<<20)
	for i := range nMiB {
		for j := range buf {
			buf[j] = byte(rng.Uint32())
		}
		off := int64(i) * int64(sizeMiB/nMiB) << 20
		if _, err := f.WriteAt(buf, off); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	if format == "raw" {
		return raw
	}
	out := filepath.Join(dir, "disk.qcow2")
	testenv.Run(t, "qemu-img", "convert", "-O", "qcow2", raw, out)
	return out
}

// pullWithSkopeo copies ref with skopeo into a dir: layout and extracts the
// single file under disk/ the way CDI's importer does, checking that it is
// the only file there and is owned by 107:107.
func pullWithSkopeo(t *testing.T, ref string, skopeoArgs ...string) string {
	t.Helper()
	return skopeoPull(t, nil, ref, skopeoArgs...)
}

// skopeoPull is pullWithSkopeo with skopeo's global options (e.g.
// --override-arch) before "copy".
func skopeoPull(t *testing.T, global []string, ref string, copyArgs ...string) string {
	t.Helper()
	need.Program(t, "skopeo")
	out := filepath.Join(t.TempDir(), "pulled")
	args := append(append(slices.Clone(global), "copy", "--src-tls-verify=false"), copyArgs...)
	testenv.Run(t, "skopeo", append(args, "docker://"+ref, "dir:"+out)...)
	var m struct {
		MediaType string `json:"mediaType"`
		Layers    []struct {
			MediaType string `json:"mediaType"`
			Digest    string `json:"digest"`
		} `json:"layers"`
	}
	b, err := os.ReadFile(filepath.Join(out, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if len(m.Layers) != 1 {
		t.Fatalf("%d layers, want 1", len(m.Layers))
	}
	blob, err := os.Open(filepath.Join(out, strings.TrimPrefix(m.Layers[0].Digest, "sha256:")))
	if err != nil {
		t.Fatal(err)
	}
	defer blob.Close()
	var r io.Reader = blob
	switch {
	case strings.HasSuffix(m.Layers[0].MediaType, "+gzip"):
		gz, err := gzip.NewReader(blob)
		if err != nil {
			t.Fatal(err)
		}
		r = gz
	case strings.HasSuffix(m.Layers[0].MediaType, "+zstd"):
		zr, err := zstd.NewReader(blob)
		if err != nil {
			t.Fatal(err)
		}
		defer zr.Close()
		r = zr
	}
	tr := tar.NewReader(r)
	disk := ""
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Uid != api.DiskUID || h.Gid != api.DiskGID {
			t.Errorf("%s is owned by %d:%d", h.Name, h.Uid, h.Gid)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		if !strings.HasPrefix(h.Name, "disk/") || disk != "" {
			t.Fatalf("unexpected file %s in the layer", h.Name)
		}
		disk = filepath.Join(t.TempDir(), "disk.img")
		f, err := os.Create(disk)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(f, tr); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	if disk == "" {
		t.Fatal("no file under disk/")
	}
	return disk
}

func TestImportThenSkopeoPull(t *testing.T) {
	testenv.RequireQEMU(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{})
	dir := t.TempDir()
	qcow := makeDisk(t, dir, 64, 6, "qcow2")
	for _, tc := range []struct{ disk, comp string }{
		{"qcow2", "gzip"}, {"qcow2", "zstd"}, {"raw", "gzip"}, {"raw", "zstd"},
	} {
		t.Run(tc.disk+"-"+tc.comp, func(t *testing.T) {
			ref := fmt.Sprintf("%s/acme/disk-%s:%s", reg.Host, tc.disk, tc.comp)
			res := importOK(t, t.TempDir(), qcow, ref, "--disk-format", tc.disk, "--compression", tc.comp)
			if res.UploadedBytes != res.LayerSize || res.Reused {
				t.Errorf("first import: %+v", res)
			}
			disk := pullWithSkopeo(t, ref)
			testenv.Run(t, "qemu-img", "compare", "-q", "-F", tc.disk, qcow, disk)
		})
	}
}

func TestImportWithAuthAndTLS(t *testing.T) {
	testenv.RequireQEMU(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{Username: "tenant", Password: "s3cret", TLS: true})
	dir := t.TempDir()
	qcow := makeDisk(t, dir, 16, 2, "qcow2")
	ref := reg.Host + "/acme/secure:1"
	r := testenv.RunCommand(t, testenv.Command{
		Name:  testenv.Imagectl,
		Args:  []string{"import", "--quiet", qcow, ref, "--username", "tenant", "--password-stdin", "--ca-file", reg.CAFile},
		Env:   []string{"IMAGEPIPE_CACHE=" + t.TempDir()},
		Stdin: "s3cret\n",
	})
	if r.Code != 0 {
		t.Fatalf("exit %d: %s", r.Code, r.Stderr)
	}
	if !strings.HasPrefix(r.Stdout, ref+"@sha256:") {
		t.Errorf("output %q", r.Stdout)
	}
	disk := pullWithSkopeo(t, ref, "--src-creds", "tenant:s3cret")
	testenv.Run(t, "qemu-img", "compare", "-q", qcow, disk)

	bad := testenv.RunCommand(t, testenv.Command{
		Name:  testenv.Imagectl,
		Args:  []string{"import", "--quiet", qcow, reg.Host + "/acme/secure:2", "--username", "tenant", "--password-stdin", "--ca-file", reg.CAFile},
		Env:   []string{"IMAGEPIPE_CACHE=" + t.TempDir()},
		Stdin: "wrong\n",
	})
	if bad.Code != 1 || !strings.Contains(bad.Stderr, "wrong credentials for "+reg.Host) {
		t.Errorf("wrong password: exit %d, %s", bad.Code, bad.Stderr)
	}
}

func TestReimportOnlyTagsAndIsReproducible(t *testing.T) {
	testenv.RequireQEMU(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{})
	qcow := makeDisk(t, t.TempDir(), 32, 4, "qcow2")
	cache := t.TempDir()
	first := importOK(t, cache, qcow, reg.Host+"/acme/app:1")
	again := importOK(t, cache, qcow, reg.Host+"/acme/app:2")
	if !again.Reused || again.UploadedBytes != 0 || again.Digest != first.Digest {
		t.Errorf("re-import: %+v, first %+v", again, first)
	}
	// Another machine (no build record) builds afresh, in the same or
	// another repository, and gets the same digest; with the record, the
	// blobs are mounted into another repository.
	for _, repo := range []string{"acme/app:3", "acme/copy:1"} {
		other := importOK(t, t.TempDir(), qcow, reg.Host+"/"+repo)
		if other.Reused || other.Digest != first.Digest || other.UploadedBytes != other.LayerSize {
			t.Errorf("rebuild into %s without the build record: %+v, want digest %s", repo, other, first.Digest)
		}
	}
	mounted := importOK(t, cache, qcow, reg.Host+"/acme/mounted:1")
	if !mounted.Reused || mounted.UploadedBytes != 0 || mounted.Digest != first.Digest {
		t.Errorf("import into another repository with the build record: %+v", mounted)
	}
}

// TestImportResumesAfterBrokenConnections cuts the connection to the
// registry three times during the layer upload: the import completes, and
// at most one chunk is sent again per cut.
func TestImportResumesAfterBrokenConnections(t *testing.T) {
	testenv.RequireQEMU(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{})
	// 40 MiB of random data: the layer is about that size whatever the
	// compression, so cuts at these offsets land inside the blob upload.
	raw := makeDisk(t, t.TempDir(), 64, 40, "raw")
	const mib = 1 << 20
	proxy := harness.StartCutProxy(t, reg.Host, 3*mib, 13*mib+12345, 27*mib)
	res := importOK(t, t.TempDir(), raw, proxy.Addr+"/acme/flaky:1", "--compression", "none")
	if proxy.Cuts() != 3 {
		t.Fatalf("%d cuts happened, want 3", proxy.Cuts())
	}
	// Each cut costs at most the rest of one chunk; the proxy counts what
	// really crossed the wire (requests and their headers included).
	const chunk = 8 * mib
	if extra := res.UploadedBytes - res.LayerSize; extra < 0 || extra > 3*chunk {
		t.Errorf("sent %d layer bytes for a %d-byte layer: %d extra, want at most %d", res.UploadedBytes, res.LayerSize, extra, 3*chunk)
	}
	if extra := proxy.Forwarded() - res.LayerSize; extra > 3*chunk+mib {
		t.Errorf("the proxy forwarded %d bytes for a %d-byte layer", proxy.Forwarded(), res.LayerSize)
	}
	t.Logf("layer %d bytes, sent %d, proxy forwarded %d", res.LayerSize, res.UploadedBytes, proxy.Forwarded())
	disk := pullWithSkopeo(t, reg.Host+"/acme/flaky:1")
	testenv.Run(t, "qemu-img", "compare", "-q", "-f", "raw", raw, disk)
}

// TestRegistryDiesMidImport kills the registry during the upload: the
// import fails without a tag, and a re-run after the restart completes,
// resuming the upload the registry kept instead of starting over.
func TestRegistryDiesMidImport(t *testing.T) {
	testenv.RequireQEMU(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{})
	raw := makeDisk(t, t.TempDir(), 64, 48, "raw")
	cache := t.TempDir()
	const mib = 1 << 20
	// The proxy cuts once at 30 MiB; at that moment the registry dies.
	proxy := harness.StartCutProxy(t, reg.Host, 30*mib)
	ref := proxy.Addr + "/acme/dying:1"
	done := make(chan testenv.Result, 1)
	go func() { done <- importCmd(t, cache, raw, ref, "--compression", "none") }()
	for proxy.Cuts() == 0 {
		select {
		case r := <-done:
			t.Fatalf("import ended before the cut: %+v", r)
		default:
		}
		waitABit()
	}
	reg.Kill(t)
	r := <-done
	if r.Code == 0 {
		t.Fatal("import succeeded with the registry dead")
	}
	// One sentence a person can act on: not the registry's upload URL.
	if !strings.Contains(r.Stderr, "run the same command again to resume") || strings.Contains(r.Stderr, "_state=") {
		t.Errorf("the failed import does not say to run it again, or prints the upload URL:\n%s", r.Stderr)
	}
	reg.Restart(t)
	if tags := reg.Tags(t, "acme/dying"); len(tags) != 0 {
		t.Fatalf("tags after a failed import: %v", tags)
	}
	res := importOK(t, cache, raw, ref, "--compression", "none")
	if res.UploadedBytes >= res.LayerSize-16*mib {
		t.Errorf("the re-run sent %d of %d layer bytes; it should have resumed", res.UploadedBytes, res.LayerSize)
	}
	disk := pullWithSkopeo(t, reg.Host+"/acme/dying:1")
	testenv.Run(t, "qemu-img", "compare", "-q", "-f", "raw", raw, disk)
}

func TestHostileImagesPushNothing(t *testing.T) {
	testenv.RequireQEMU(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{})
	dir := t.TempDir()
	backing := filepath.Join(dir, "backing.qcow2")
	testenv.Run(t, "qemu-img", "create", "-q", "-f", "qcow2", "-b", "/etc/passwd", "-F", "raw", backing)
	vmdk := filepath.Join(dir, "disk.vmdk")
	testenv.Run(t, "qemu-img", "create", "-q", "-f", "vmdk", vmdk, "16M")
	garbage := corruptCompressedCluster(t, dir)
	for _, src := range []string{backing, vmdk, garbage} {
		r := importCmd(t, t.TempDir(), src, reg.Host+"/acme/hostile:"+strings.TrimSuffix(filepath.Base(src), filepath.Ext(src)))
		if r.Code != 3 {
			t.Errorf("%s: exit %d, want 3\n%s", filepath.Base(src), r.Code, r.Stderr)
		}
	}
	if tags := reg.Tags(t, "acme/hostile"); len(tags) != 0 {
		t.Errorf("tags after rejected imports: %v", tags)
	}
}

// corruptCompressedCluster makes a compressed qcow2 whose last compressed
// cluster is garbage, so the rejection comes while the layer streams.
func corruptCompressedCluster(t *testing.T, dir string) string {
	t.Helper()
	raw := filepath.Join(dir, "pattern.raw")
	testenv.Run(t, "qemu-img", "create", "-q", "-f", "raw", raw, "8M")
	testenv.Run(t, "qemu-io", "-f", "raw", "-c", "write -P 0x61 0 3M", "-c", "write -P 0x62 5M 2M", raw)
	p := filepath.Join(dir, "garbage.qcow2")
	testenv.Run(t, "qemu-img", "convert", "-c", "-O", "qcow2", raw, p)
	testenv.CorruptLastCompressedCluster(t, p)
	return p
}

// TestImportPeakMemory measures imagectl's peak RSS with GNU time while it
// imports a 4 GiB and a 64 GiB-virtual disk: at most 128 MiB whatever the
// size.
func TestImportPeakMemory(t *testing.T) {
	testenv.RequireQEMU(t)
	need.Program(t, "/usr/bin/time")
	reg := harness.StartRegistry(t, harness.RegistryOptions{})
	dir := t.TempDir()
	for _, tc := range []struct {
		name    string
		sizeGiB int
		format  string
	}{{"4GiB-raw", 4, "raw"}, {"64GiB-qcow2", 64, "qcow2"}} {
		raw := filepath.Join(dir, tc.name+".raw")
		f, err := os.Create(raw)
		if err != nil {
			t.Fatal(err)
		}
		f.Truncate(int64(tc.sizeGiB) << 30)
		rng := rand.New(rand.NewPCG(1, uint64(tc.sizeGiB)))
		buf := make([]byte, 4<<20)
		for i := range buf {
			buf[i] = byte(rng.Uint32())
		}
		for i := range 8 { // 32 MiB of data spread over the disk
			f.WriteAt(buf, int64(i)*(int64(tc.sizeGiB)<<27))
		}
		f.Close()
		src := raw
		if tc.format == "qcow2" {
			src = filepath.Join(dir, tc.name+".qcow2")
			testenv.Run(t, testenv.Imagectl, "convert", raw, src)
		}
		rss := filepath.Join(dir, tc.name+".rss")
		r := testenv.RunCommand(t, testenv.Command{
			Name: "/usr/bin/time",
			Args: []string{"-f", "%M", "-o", rss, testenv.Imagectl, "import", "--quiet", src, reg.Host + "/acme/big:" + tc.name},
			Env:  []string{"IMAGEPIPE_CACHE=" + t.TempDir()},
		})
		if r.Code != 0 {
			t.Fatalf("%s: exit %d: %s", tc.name, r.Code, r.Stderr)
		}
		b, _ := os.ReadFile(rss)
		var kib int64
		if _, err := fmt.Sscan(string(b), &kib); err != nil {
			t.Fatalf("GNU time output %q: %v", b, err)
		}
		t.Logf("%s: peak RSS %d KiB", tc.name, kib)
		if kib > 128<<10 {
			t.Errorf("%s: peak RSS %d KiB, over 128 MiB", tc.name, kib)
		}
	}
}
