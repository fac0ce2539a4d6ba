package commands

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"sigs.k8s.io/yaml"

	"github.com/imagepipe/imagepipe/internal/reject"
	"github.com/imagepipe/imagepipe/pkg/api"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// fixture is a registry holding acme/alpha:1 (qcow2, with a default
// instancetype), acme/beta:1 (raw) and other/gamma:1, and the disks they
// were imported from.
type fixture struct {
	reg        *harness.Registry
	dir        string
	cache      string // IMAGEPIPE_CACHE of every imagectl run
	alpha      string // qcow2 source of alpha and gamma
	beta       string // raw source of beta
	alphaRef   string
	betaRef    string
	gammaRef   string
	alphaPin   string // alphaRef's repository @digest, as import printed it
	betaDigest string
}

func setup(t *testing.T) *fixture {
	t.Helper()
	testenv.RequireQEMU(t)
	f := &fixture{reg: harness.StartRegistry(t, harness.RegistryOptions{}), dir: t.TempDir(), cache: t.TempDir()}
	f.alpha = makeDisk(t, f.dir, "alpha", "qcow2", 0x61)
	f.beta = makeDisk(t, f.dir, "beta", "raw", 0x62)
	f.alphaRef = f.reg.Host + "/acme/alpha:1"
	f.betaRef = f.reg.Host + "/acme/beta:1"
	f.gammaRef = f.reg.Host + "/other/gamma:1"
	f.alphaPin = f.importOK(t, f.alpha, f.alphaRef, "--default-instancetype", "u1.small")
	f.betaDigest = digestOf(f.importOK(t, f.beta, f.betaRef, "--disk-format", "raw"))
	f.importOK(t, f.alpha, f.gammaRef)
	return f
}

// makeDisk writes a 4 MiB disk with two data ranges filled with fill, in
// format, using qemu-img and qemu-io.
func makeDisk(t *testing.T, dir, base, format string, fill byte) string {
	t.Helper()
	raw := filepath.Join(dir, base+".raw")
	testenv.Run(t, "qemu-img", "create", "-q", "-f", "raw", raw, "4M")
	testenv.Run(t, "qemu-io", "-f", "raw",
		"-c", "write -P "+strconv.Itoa(int(fill))+" 0 1M",
		"-c", "write -P "+strconv.Itoa(int(fill)+1)+" 3M 512k", raw)
	if format == "raw" {
		return raw
	}
	p := filepath.Join(dir, base+".qcow2")
	testenv.Run(t, "qemu-img", "convert", "-O", "qcow2", raw, p)
	return p
}

// imagectl runs imagectl with the fixture's cache and stdin.
func (f *fixture) imagectl(t *testing.T, stdin string, args ...string) testenv.Result {
	t.Helper()
	return testenv.RunCommand(t, testenv.Command{
		Name:  testenv.Imagectl,
		Args:  args,
		Env:   []string{"IMAGEPIPE_CACHE=" + f.cache},
		Stdin: stdin,
	})
}

// ok runs imagectl, fails the test unless it exits 0, and returns stdout.
func (f *fixture) ok(t *testing.T, args ...string) string {
	t.Helper()
	r := f.imagectl(t, "", args...)
	if r.Code != 0 {
		t.Fatalf("imagectl %s: exit %d\n%s", strings.Join(args, " "), r.Code, r.Stderr)
	}
	return r.Stdout
}

// importOK imports src as ref and returns the REPOSITORY@DIGEST it printed.
func (f *fixture) importOK(t *testing.T, src, ref string, args ...string) string {
	t.Helper()
	out := strings.TrimSpace(f.ok(t, append([]string{"import", src, ref, "--quiet"}, args...)...))
	repo, _, _ := strings.Cut(ref[len(f.reg.Host):], ":")
	if !strings.HasPrefix(out, f.reg.Host+repo+"@sha256:") && !strings.HasPrefix(out, ref+"@sha256:") {
		t.Fatalf("import printed %q", out)
	}
	return out
}

func digestOf(pinned string) string {
	_, d, _ := strings.Cut(pinned, "@")
	return d
}

// list runs `imagectl list -o json` for a tenant.
func (f *fixture) list(t *testing.T, tenant string) []api.ImageListing {
	t.Helper()
	var ls []api.ImageListing
	if err := json.Unmarshal([]byte(f.ok(t, "list", f.reg.Host+"/"+tenant, "-o", "json")), &ls); err != nil {
		t.Fatal(err)
	}
	return ls
}

func tagsOf(ls []api.ImageListing) []string {
	var tags []string
	for _, l := range ls {
		tags = append(tags, l.Repository[strings.Index(l.Repository, "/")+1:]+":"+l.Tag)
	}
	return tags
}

// entry is one file of a hand-built layer.
type entry struct {
	name     string
	dir      bool
	uid, gid int
	mode     int64
	data     []byte
}

// pushLayer pushes an OCI image with one gzip layer holding entries.
func pushLayer(t *testing.T, ref string, entries []entry) {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Uid: e.uid, Gid: e.gid, Mode: e.mode, Typeflag: tar.TypeReg, Size: int64(len(e.data))}
		if e.dir {
			h.Typeflag, h.Size = tar.TypeDir, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(e.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(buf.Bytes())), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		t.Fatal(err)
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.AppendLayers(base, layer)
	if err != nil {
		t.Fatal(err)
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestList(t *testing.T) {
	f := setup(t)
	foreign, err := random.Image(1024, 1)
	if err != nil {
		t.Fatal(err)
	}
	foreignRef, err := name.ParseReference(f.reg.Host + "/acme/foreign:latest")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(foreignRef, foreign); err != nil {
		t.Fatal(err)
	}

	ls := f.list(t, "acme")
	if got, want := tagsOf(ls), []string{"acme/alpha:1", "acme/beta:1", "acme/foreign:latest"}; !slices.Equal(got, want) {
		t.Fatalf("list acme = %v, want %v (no build-key tags, no other tenant)", got, want)
	}
	for i, want := range []struct{ format, digest string }{{"qcow2", digestOf(f.alphaPin)}, {"raw", f.betaDigest}} {
		l := ls[i]
		if l.DiskFormat != want.format || l.Digest != want.digest || l.VirtualSize != 4<<20 || !strings.HasPrefix(l.SourceDigest, "sha256:") {
			t.Errorf("listing %d = %+v, want format %s and digest %s", i, l, want.format, want.digest)
		}
	}
	if l := ls[2]; l.DiskFormat != "" || l.VirtualSize != 0 || !strings.HasPrefix(l.Digest, "sha256:") {
		t.Errorf("foreign image listed as %+v", l)
	}
	if got := tagsOf(f.list(t, "other")); !slices.Equal(got, []string{"other/gamma:1"}) {
		t.Errorf("list other = %v", got)
	}

	var fromYAML []api.ImageListing
	if err := yaml.Unmarshal([]byte(f.ok(t, "list", f.reg.Host+"/acme", "-o", "yaml")), &fromYAML); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(fromYAML, ls) {
		t.Errorf("yaml listing %+v differs from json %+v", fromYAML, ls)
	}

	table := f.ok(t, "list", f.reg.Host+"/acme")
	lines := strings.Split(strings.TrimSpace(table), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "REPOSITORY") {
		t.Fatalf("table:\n%s", table)
	}
	alpha := strings.Fields(lines[1])
	if alpha[2] != digestOf(f.alphaPin)[7:19] || alpha[5] != "qcow2" || alpha[6] != "-" {
		t.Errorf("alpha row %q", lines[1])
	}
	if foreign := strings.Fields(lines[3]); foreign[3] != "-" || foreign[4] != "-" {
		t.Errorf("foreign row %q", lines[3])
	}

	// One repository, as crane ls: its tags only, described the same way,
	// without the catalog; -o name gives references to use as they are.
	var alphaOnly []api.ImageListing
	if err := json.Unmarshal([]byte(f.ok(t, "list", f.reg.Host+"/acme/alpha", "-o", "json")), &alphaOnly); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(alphaOnly, ls[:1]) {
		t.Errorf("list of one repository = %+v, want %+v", alphaOnly, ls[:1])
	}
	if names := f.ok(t, "list", f.reg.Host+"/acme", "-o", "name"); names != ls[0].Repository+":1\n"+ls[1].Repository+":1\n"+ls[2].Repository+":latest\n" {
		t.Errorf("list -o name:\n%s", names)
	}
	if wide := f.ok(t, "list", f.reg.Host+"/acme/alpha", "-o", "wide"); !strings.Contains(wide, digestOf(f.alphaPin)) || !strings.Contains(wide, ls[0].SourceDigest) {
		t.Errorf("list -o wide lacks the full digest or the source digest:\n%s", wide)
	}
	if r := f.imagectl(t, "", "list", f.reg.Host+"/acme/alpha:1"); r.Code != 1 || !strings.Contains(r.Stderr, "not a tag or digest") {
		t.Errorf("list of a tag: exit %d, %s", r.Code, r.Stderr)
	}
}

func TestInspectRemote(t *testing.T) {
	f := setup(t)
	r := f.imagectl(t, "", "inspect", "docker://"+f.alphaRef, "-o", "json")
	if r.Code != 0 {
		t.Fatalf("inspect of an imported image: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	var rep api.ContainerDiskReport
	if err := json.Unmarshal([]byte(r.Stdout), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Verdict != api.VerdictAccepted || rep.Digest != digestOf(f.alphaPin) || rep.DiskFormat != "qcow2" ||
		rep.VirtualSize != 4<<20 || rep.Checked != api.CheckedHeader || rep.Platform != "linux/amd64" ||
		rep.LayerMediaType != string(types.OCILayer) || rep.MediaType != string(types.OCIManifestSchema1) {
		t.Errorf("report = %+v", rep)
	}
	if rep.Annotations[api.AnnotationDiskFormat] != "qcow2" || rep.Annotations[api.AnnotationVirtualSize] != "4194304" ||
		!strings.HasPrefix(rep.Annotations[api.AnnotationBuildKey], "sha256:") {
		t.Errorf("annotations = %v", rep.Annotations)
	}
	if !slices.Contains(rep.Env, api.EnvDefaultInstancetype+"=u1.small") {
		t.Errorf("env = %v", rep.Env)
	}
	table := f.ok(t, "inspect", "docker://"+f.betaRef)
	for _, want := range []string{"verdict:", "accepted", "io.imagepipe.disk.format=raw", "header checks passed"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}

	qcow := readFile(t, f.alpha)
	overlay := filepath.Join(f.dir, "overlay.qcow2")
	testenv.Run(t, "qemu-img", "create", "-q", "-f", "qcow2", "-b", "/etc/passwd", "-F", "raw", overlay, "4M")
	dir := entry{name: "disk/", dir: true, uid: 107, gid: 107, mode: 0o555}
	for _, tc := range []struct {
		name    string
		entries []entry
		reason  reject.Reason
	}{
		{"two disks", []entry{dir, {name: "disk/a.img", uid: 107, gid: 107, mode: 0o444, data: qcow}, {name: "disk/b.img", uid: 107, gid: 107, mode: 0o444, data: qcow}}, reject.TarEntry},
		{"owned by root", []entry{dir, {name: "disk/disk.img", mode: 0o444, data: qcow}}, reject.DiskOwner},
		{"writable", []entry{dir, {name: "disk/disk.img", uid: 107, gid: 107, mode: 0o644, data: qcow}}, reject.DiskMode},
		{"no directory", []entry{{name: "disk/disk.img", uid: 107, gid: 107, mode: 0o444, data: qcow}}, reject.TarEntry},
		{"backing file", []entry{dir, {name: "disk/disk.img", uid: 107, gid: 107, mode: 0o444, data: readFile(t, overlay)}}, "backing-file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ref := f.reg.Host + "/acme/bad:" + strings.ReplaceAll(tc.name, " ", "-")
			pushLayer(t, ref, tc.entries)
			r := f.imagectl(t, "", "inspect", "docker://"+ref, "-o", "json")
			var rep api.ContainerDiskReport
			if err := json.Unmarshal([]byte(r.Stdout), &rep); err != nil {
				t.Fatalf("exit %d, stdout %q: %v", r.Code, r.Stdout, err)
			}
			if r.Code != 3 || rep.Verdict != api.VerdictRejected || len(rep.Reasons) != 1 || rep.Reasons[0].Code != string(tc.reason) {
				t.Errorf("exit %d, report %+v; want 3 and %s", r.Code, rep, tc.reason)
			}
		})
	}
}

func TestExport(t *testing.T) {
	f := setup(t)
	out := t.TempDir()
	for _, tc := range []struct {
		ref, orig, to, file, format string
	}{
		{f.alphaRef, f.alpha, "", "alpha.qcow2", "qcow2"},
		{f.alphaRef, f.alpha, "raw", "alpha.raw", "raw"},
		{f.betaRef, f.beta, "", "beta.raw", "raw"},
		{f.betaRef, f.beta, "qcow2", "beta.qcow2", "qcow2"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			p := filepath.Join(out, tc.file)
			args := []string{"export", tc.ref, p}
			if tc.to != "" {
				args = append(args, "--to", tc.to)
			}
			f.ok(t, args...)
			testenv.Run(t, "qemu-img", "compare", "-q", tc.orig, p)
			var info struct {
				Format string `json:"format"`
			}
			if err := json.Unmarshal(testenv.Run(t, "qemu-img", "info", "--output", "json", p), &info); err != nil {
				t.Fatal(err)
			}
			if info.Format != tc.format {
				t.Errorf("%s is %s, want %s", tc.file, info.Format, tc.format)
			}
		})
	}
	if got, want := testenv.Entries(t, out), []string{"alpha.qcow2", "alpha.raw", "beta.qcow2", "beta.raw"}; !slices.Equal(got, want) {
		t.Errorf("export left %v", got)
	}

	t.Run("rejected", func(t *testing.T) {
		bad := f.reg.Host + "/acme/bad:two-disks"
		d := entry{name: "disk/", dir: true, uid: 107, gid: 107, mode: 0o555}
		pushLayer(t, bad, []entry{d, {name: "disk/disk.img", uid: 107, gid: 107, mode: 0o444, data: readFile(t, f.alpha)}, {name: "disk/b.img", uid: 107, gid: 107, mode: 0o444}})
		dir := t.TempDir()
		r := f.imagectl(t, "", "export", bad, filepath.Join(dir, "out.qcow2"))
		if r.Code != 3 || !strings.Contains(r.Stderr, string(reject.TarEntry)) {
			t.Errorf("exit %d, stderr %q; want 3 and %s", r.Code, r.Stderr, reject.TarEntry)
		}
		if left := testenv.Entries(t, dir); len(left) != 0 {
			t.Errorf("a rejected export left %v", left)
		}

		// A disk that passes the layer's checks but not the disk's: to
		// standard output, not one byte of it may go out.
		backing := filepath.Join(dir, "overlay.qcow2")
		testenv.Run(t, "qemu-img", "create", "-q", "-f", "qcow2", "-b", "/etc/passwd", "-F", "raw", backing)
		overlay := f.reg.Host + "/acme/bad:backing-file"
		pushLayer(t, overlay, []entry{d, {name: "disk/disk.img", uid: 107, gid: 107, mode: 0o444, data: readFile(t, backing)}})
		r = f.imagectl(t, "", "export", overlay, "-")
		if r.Code != 3 || !strings.Contains(r.Stderr, string(reject.BackingFile)) || r.Stdout != "" {
			t.Errorf("export - of a disk with a backing file: exit %d, %d bytes on stdout, stderr %q", r.Code, len(r.Stdout), r.Stderr)
		}
	})
}

func TestDelete(t *testing.T) {
	f := setup(t)
	// The same source and options: the same image, only tagged.
	if again := f.importOK(t, f.alpha, f.reg.Host+"/acme/alpha:2", "--default-instancetype", "u1.small"); digestOf(again) != digestOf(f.alphaPin) {
		t.Fatalf("re-import gave %s, want %s", again, f.alphaPin)
	}

	r := f.imagectl(t, "", "delete", f.alphaRef)
	if r.Code != 1 || !strings.Contains(r.Stderr, "also tagged 2") || !strings.Contains(r.Stderr, "--force") {
		t.Errorf("delete of a shared image: exit %d, stderr %q", r.Code, r.Stderr)
	}
	if got := tagsOf(f.list(t, "acme")); !slices.Equal(got, []string{"acme/alpha:1", "acme/alpha:2", "acme/beta:1"}) {
		t.Fatalf("after a refused delete: %v", got)
	}

	out := f.ok(t, "delete", f.betaRef)
	if !strings.Contains(out, "deleted "+f.reg.Host+"/acme/beta@"+f.betaDigest) {
		t.Errorf("delete printed %q", out)
	}
	if got := tagsOf(f.list(t, "acme")); !slices.Equal(got, []string{"acme/alpha:1", "acme/alpha:2"}) {
		t.Errorf("after deleting beta:1: %v", got)
	}

	out = f.ok(t, "delete", "--force", f.alphaRef)
	if !strings.Contains(out, "untagged 1, 2") {
		t.Errorf("delete --force printed %q", out)
	}
	if got := f.list(t, "acme"); len(got) != 0 {
		t.Errorf("after deleting alpha: %v", tagsOf(got))
	}
	if tags := f.reg.Tags(t, "acme/alpha"); len(tags) > 0 {
		t.Errorf("tags left in acme/alpha: %v", tags)
	}

	ls := f.list(t, "other")
	f.ok(t, "delete", f.reg.Host+"/other/gamma@"+ls[0].Digest)
	if got := f.list(t, "other"); len(got) != 0 {
		t.Errorf("after deleting gamma by digest: %v", tagsOf(got))
	}
}

func TestCopy(t *testing.T) {
	f := setup(t)
	dst := f.reg.Host + "/acme/alpha-copy:1"
	out := strings.TrimSpace(f.ok(t, "copy", f.alphaRef, dst))
	if want := f.reg.Host + "/acme/alpha-copy@" + digestOf(f.alphaPin); out != want {
		t.Errorf("copy printed %q, want %q", out, want)
	}
	// The build key came along: importing the same source only tags.
	r := f.imagectl(t, "", "import", f.alpha, f.reg.Host+"/acme/alpha-copy:2", "--quiet", "--default-instancetype", "u1.small", "-o", "json")
	var res api.ImportResult
	if err := json.Unmarshal([]byte(r.Stdout), &res); err != nil || !res.Reused || res.Digest != digestOf(f.alphaPin) {
		t.Errorf("re-import into the copy: exit %d, %+v, %v", r.Code, res, err)
	}

	secure := harness.StartRegistry(t, harness.RegistryOptions{Username: "tenant", Password: "s3cret", TLS: true})
	auth := []string{"--username", "tenant", "--password-stdin", "--ca-file", secure.CAFile}
	src := secure.Host + "/acme/secure:1"
	r = f.imagectl(t, "s3cret\n", append([]string{"import", f.alpha, src, "--quiet"}, auth...)...)
	if r.Code != 0 {
		t.Fatalf("import into the TLS registry: exit %d\n%s", r.Code, r.Stderr)
	}
	secureDigest := digestOf(strings.TrimSpace(r.Stdout))
	plain := f.reg.Host + "/acme/from-secure:1"
	r = f.imagectl(t, "s3cret\n", append([]string{"copy", src, plain}, auth...)...)
	if r.Code != 0 {
		t.Fatalf("copy from the TLS registry: exit %d\n%s", r.Code, r.Stderr)
	}
	if want := f.reg.Host + "/acme/from-secure@" + secureDigest; strings.TrimSpace(r.Stdout) != want {
		t.Errorf("copy printed %q, want %q", r.Stdout, want)
	}
	var inspected struct{ Digest string }
	if err := json.Unmarshal(testenv.Run(t, "skopeo", "inspect", "--tls-verify=false", "docker://"+plain), &inspected); err != nil {
		t.Fatal(err)
	}
	if inspected.Digest != secureDigest {
		t.Errorf("skopeo sees %s, want %s", inspected.Digest, secureDigest)
	}
	if r := f.imagectl(t, "", "copy", src, plain, "--ca-file", secure.CAFile); r.Code != 1 {
		t.Errorf("copy from the TLS registry without credentials: exit %d", r.Code)
	}
}
