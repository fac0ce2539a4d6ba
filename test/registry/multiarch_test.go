package registry

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/imagepipe/imagepipe/internal/diskimage"
	"github.com/imagepipe/imagepipe/internal/imageref"
	"github.com/imagepipe/imagepipe/internal/need"
	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/pkg/api"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// imagectl runs imagectl with its own cache directory.
func imagectl(t *testing.T, cache string, args ...string) testenv.Result {
	t.Helper()
	return testenv.RunCommand(t, testenv.Command{Name: testenv.Imagectl, Args: args, Env: []string{"IMAGEPIPE_CACHE=" + cache}})
}

// inspectJSON runs imagectl inspect -o json on a docker:// reference and
// returns its exit code and report.
func inspectJSON(t *testing.T, ref string, args ...string) (int, api.ContainerDiskReport) {
	t.Helper()
	r := imagectl(t, t.TempDir(), append(append([]string{"inspect", "-o", "json"}, args...), "docker://"+ref)...)
	var rep api.ContainerDiskReport
	if err := json.Unmarshal([]byte(r.Stdout), &rep); err != nil {
		t.Fatalf("inspect %s %v: exit %d, output %q: %v\n%s", ref, args, r.Code, r.Stdout, err, r.Stderr)
	}
	return r.Code, rep
}

// skopeoIndex is what skopeo inspect --raw shows of an index.
type skopeoIndex struct {
	MediaType string `json:"mediaType"`
	Manifests []struct {
		MediaType string `json:"mediaType"`
		Digest    string `json:"digest"`
		Platform  struct {
			OS           string `json:"os"`
			Architecture string `json:"architecture"`
		} `json:"platform"`
	} `json:"manifests"`
}

func requireSkopeo(t *testing.T) {
	t.Helper()
	need.Program(t, "skopeo")
}

// TestPublishOneTagForTwoArchitectures publishes an amd64 and an arm64
// disk under one tag with imagectl import --append, and checks the index
// with skopeo as an independent client, imagectl inspect, export and copy
// with and without --platform, and the syncer's checker for each hub
// architecture.
func TestPublishOneTagForTwoArchitectures(t *testing.T) {
	testenv.RequireQEMU(t)
	requireSkopeo(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{})
	disks := map[string]string{
		"amd64": makeDisk(t, t.TempDir(), 32, 4, "qcow2"),
		"arm64": makeDisk(t, t.TempDir(), 24, 3, "qcow2"),
	}
	cache := t.TempDir()
	ref := reg.Host + "/acme/fedora:41"
	amd := importOK(t, cache, disks["amd64"], ref, "--append", "--platform", "linux/amd64")
	arm := importOK(t, cache, disks["arm64"], ref, "--append", "--platform", "linux/arm64")
	images := map[string]string{"amd64": amd.ImageDigest, "arm64": arm.ImageDigest}
	if amd.ImageDigest == "" || arm.ImageDigest == amd.ImageDigest || arm.Platform != "linux/arm64" ||
		!slices.Equal(arm.Platforms, []string{"linux/amd64", "linux/arm64"}) {
		t.Fatalf("imports: %+v, %+v", amd, arm)
	}

	// skopeo sees one index, the one imagectl reported, of both images.
	raw := testenv.Run(t, "skopeo", "inspect", "--raw", "--tls-verify=false", "docker://"+ref)
	var idx skopeoIndex
	if err := json.Unmarshal(raw, &idx); err != nil {
		t.Fatalf("skopeo inspect --raw: %v\n%s", err, raw)
	}
	if got := fmt.Sprintf("sha256:%x", sha256.Sum256(raw)); got != arm.Digest {
		t.Errorf("the tag holds %s, imagectl reported %s", got, arm.Digest)
	}
	if idx.MediaType != "application/vnd.oci.image.index.v1+json" || len(idx.Manifests) != 2 {
		t.Fatalf("skopeo sees %s", raw)
	}
	for i, arch := range []string{"amd64", "arm64"} {
		m := idx.Manifests[i]
		if m.Platform.OS != "linux" || m.Platform.Architecture != arch || m.Digest != images[arch] || m.MediaType != "application/vnd.oci.image.manifest.v1+json" {
			t.Errorf("index entry %d: %+v; want linux/%s %s", i, m, arch, images[arch])
		}
	}
	// skopeo picks each architecture's image: its config says so, and its
	// disk is that architecture's.
	for arch, source := range disks {
		var cfg struct{ OS, Architecture string }
		out := testenv.Run(t, "skopeo", "--override-arch", arch, "inspect", "--config", "--tls-verify=false", "docker://"+ref)
		if err := json.Unmarshal(out, &cfg); err != nil || cfg.OS != "linux" || cfg.Architecture != arch {
			t.Errorf("skopeo --override-arch %s: config %+v, %v", arch, cfg, err)
		}
		disk := skopeoPull(t, []string{"--override-arch", arch}, ref)
		testenv.Run(t, "qemu-img", "compare", "-q", source, disk)
	}

	// imagectl inspect: linux/amd64 by default, the platform asked for,
	// and a rejection naming the platforms for one the index lacks.
	for _, tc := range []struct {
		args  []string
		image string
		plat  string
	}{{nil, amd.ImageDigest, "linux/amd64"}, {[]string{"--platform", "linux/arm64"}, arm.ImageDigest, "linux/arm64"}} {
		code, rep := inspectJSON(t, ref, tc.args...)
		if code != 0 || rep.Verdict != api.VerdictAccepted || !rep.Index || rep.IndexDigest != arm.Digest || rep.Digest != tc.image ||
			rep.Platform != tc.plat || !slices.Equal(rep.Platforms, []string{"linux/amd64", "linux/arm64"}) {
			t.Errorf("inspect %v: exit %d, %+v", tc.args, code, rep)
		}
	}
	code, rep := inspectJSON(t, ref, "--platform", "linux/s390x")
	if code != 3 || rep.Verdict != api.VerdictRejected || len(rep.Reasons) != 1 || rep.Reasons[0].Code != "platform-mismatch" ||
		!strings.Contains(rep.Reasons[0].Message, "holds no linux/s390x image (it holds: linux/amd64, linux/arm64)") || rep.Digest != "" {
		t.Errorf("inspect --platform linux/s390x: exit %d, %+v", code, rep)
	}
	table := imagectl(t, t.TempDir(), "inspect", "--platform", "linux/arm64", "docker://"+ref)
	if table.Code != 0 || !strings.Contains(table.Stdout, "platforms:") || !strings.Contains(table.Stdout, "linux/amd64, linux/arm64") ||
		!strings.Contains(table.Stdout, arm.Digest) || !strings.Contains(table.Stdout, arm.ImageDigest) {
		t.Errorf("inspect table: exit %d\n%s%s", table.Code, table.Stdout, table.Stderr)
	}

	// export takes the platform's disk; a platform the index lacks writes
	// nothing.
	for _, tc := range []struct{ args []string }{{nil}, {[]string{"--platform", "linux/arm64"}}} {
		out := filepath.Join(t.TempDir(), "out.qcow2")
		r := imagectl(t, t.TempDir(), append(append([]string{"export"}, tc.args...), ref, out)...)
		want := disks["amd64"]
		if tc.args != nil {
			want = disks["arm64"]
		}
		if r.Code != 0 {
			t.Fatalf("export %v: exit %d\n%s", tc.args, r.Code, r.Stderr)
		}
		testenv.Run(t, "qemu-img", "compare", "-q", want, out)
	}
	missing := filepath.Join(t.TempDir(), "none.qcow2")
	if r := imagectl(t, t.TempDir(), "export", "--platform", "linux/s390x", ref, missing); r.Code != 3 || !strings.Contains(r.Stderr, "it holds: linux/amd64, linux/arm64") || len(testenv.Entries(t, filepath.Dir(missing))) != 0 {
		t.Errorf("export --platform linux/s390x: exit %d, %s", r.Code, r.Stderr)
	}

	// copy keeps the whole index and its digest; --platform copies one
	// image, with its own digest.
	if r := imagectl(t, cache, "copy", ref, reg.Host+"/mirror/fedora:41"); r.Code != 0 || strings.TrimSpace(r.Stdout) != reg.Host+"/mirror/fedora@"+arm.Digest {
		t.Errorf("copy: exit %d, %q %s", r.Code, r.Stdout, r.Stderr)
	}
	if got := testenv.Run(t, "skopeo", "inspect", "--raw", "--tls-verify=false", "docker://"+reg.Host+"/mirror/fedora:41"); string(got) != string(raw) {
		t.Errorf("the copied index differs:\n%s\n%s", got, raw)
	}
	if r := imagectl(t, cache, "copy", "--platform", "linux/arm64", ref, reg.Host+"/mirror/fedora:41-arm64"); r.Code != 0 || strings.TrimSpace(r.Stdout) != reg.Host+"/mirror/fedora@"+arm.ImageDigest {
		t.Errorf("copy --platform: exit %d, %q %s", r.Code, r.Stdout, r.Stderr)
	}
	one := testenv.Run(t, "skopeo", "inspect", "--raw", "--tls-verify=false", "docker://"+reg.Host+"/mirror/fedora:41-arm64")
	if !strings.Contains(string(one), `"application/vnd.oci.image.manifest.v1+json"`) || strings.Contains(string(one), `"manifests"`) {
		t.Errorf("copy --platform left %s", one)
	}
	testenv.Run(t, "qemu-img", "compare", "-q", disks["arm64"], pullWithSkopeo(t, reg.Host+"/mirror/fedora:41-arm64"))

	// The syncer's checker picks its hub's architecture from the index.
	parsed, err := imageref.Parse(ref, imageref.FormImage)
	if err != nil {
		t.Fatal(err)
	}
	for arch, image := range images {
		c, err := registry.New(registry.WithArchitecture(arch), registry.WithCacheDir(""))
		if err != nil {
			t.Fatal(err)
		}
		tag, err := registry.Names{}.Reference(parsed)
		if err != nil {
			t.Fatal(err)
		}
		rep, err := diskimage.Check(t.Context(), c, tag)
		if err != nil || rep.Verdict != api.VerdictAccepted || rep.Digest != image || rep.Platform != "linux/"+arch || rep.IndexDigest != arm.Digest {
			t.Errorf("syncer check on a %s hub: %+v, %v", arch, rep, err)
		}
	}
	c, err := registry.New(registry.WithArchitecture("s390x"), registry.WithCacheDir(""))
	if err != nil {
		t.Fatal(err)
	}
	tag, _ := registry.Names{}.Reference(parsed)
	if rep, err := diskimage.Check(t.Context(), c, tag); err != nil || rep.Verdict != api.VerdictRejected ||
		!strings.Contains(rep.Reasons[0].Message, "holds no linux/s390x image (it holds: linux/amd64, linux/arm64)") {
		t.Errorf("syncer check on an s390x hub: %+v, %v", rep, err)
	}

	// Without --append, the tag is overwritten, with a warning.
	r := imagectl(t, cache, "import", "--quiet", "--platform", "linux/arm64", disks["arm64"], ref)
	if r.Code != 0 || !strings.Contains(r.Stderr, "held an image index of linux/amd64, linux/arm64") {
		t.Errorf("import over the index: exit %d, %s", r.Code, r.Stderr)
	}
	if _, rep := inspectJSON(t, ref, "--platform", "linux/arm64"); rep.Index || rep.Digest != arm.ImageDigest {
		t.Errorf("after the overwrite: %+v", rep)
	}
}

// TestPlatformFlagRefusals: a platform imagepipe cannot publish for, or a
// flag that does not apply, fails before anything is read or sent.
func TestPlatformFlagRefusals(t *testing.T) {
	reg := harness.StartRegistry(t, harness.RegistryOptions{})
	disk := makeDisk(t, t.TempDir(), 4, 1, "raw")
	for _, tc := range []struct {
		args []string
		err  string
	}{
		{[]string{"import", "--platform", "windows/amd64", disk, reg.Host + "/acme/win:1"}, "the OS must be linux"},
		{[]string{"import", "--platform", "linux/x86_64", disk, reg.Host + "/acme/win:1"}, "did you mean linux/amd64?"},
		{[]string{"import", "--platform", "linux/arm64/v7", disk, reg.Host + "/acme/win:1"}, `unknown variant "v7" of arm64`},
		{[]string{"inspect", "--platform", "linux/arm64", disk}, "--platform applies to images in a registry"},
		{[]string{"export", "--platform", "windows/amd64", reg.Host + "/acme/win:1", filepath.Join(t.TempDir(), "x")}, "the OS must be linux"},
		{[]string{"copy", "--platform", "linux/mips128", reg.Host + "/acme/win:1", reg.Host + "/acme/win:2"}, "unknown architecture"},
	} {
		r := imagectl(t, t.TempDir(), tc.args...)
		if r.Code != 1 || !strings.Contains(r.Stderr, tc.err) {
			t.Errorf("imagectl %v: exit %d, %s; want exit 1 saying %q", tc.args, r.Code, r.Stderr, tc.err)
		}
	}
	if tags := reg.Tags(t, "acme/win"); len(tags) != 0 {
		t.Errorf("refused imports pushed %v", tags)
	}
}

// TestConcurrentAppendsNeverLeaveAPartialIndex runs two --append imports
// of different platforms to one tag at once. The protocol has no
// conditional write, so one entry may be lost (docs/import.md says so);
// what must hold is that the tag holds a complete index whose every image
// checks out, and that running a lost import again adds it.
func TestConcurrentAppendsNeverLeaveAPartialIndex(t *testing.T) {
	testenv.RequireQEMU(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{})
	ref := reg.Host + "/acme/race:1"
	disks := map[string]string{}
	for i, arch := range []string{"amd64", "arm64", "s390x"} {
		disks[arch] = makeDisk(t, t.TempDir(), 8+4*i, 1, "qcow2")
	}
	importOK(t, t.TempDir(), disks["amd64"], ref, "--append", "--platform", "linux/amd64")
	var wg sync.WaitGroup
	results := map[string]testenv.Result{}
	var mu sync.Mutex
	for _, arch := range []string{"arm64", "s390x"} {
		wg.Go(func() {
			r := importCmd(t, t.TempDir(), disks[arch], ref, "--append", "--platform", "linux/"+arch)
			mu.Lock()
			results[arch] = r
			mu.Unlock()
		})
	}
	wg.Wait()
	for arch, r := range results {
		if r.Code != 0 {
			t.Fatalf("append of %s: exit %d\n%s", arch, r.Code, r.Stderr)
		}
	}
	check := func() []string {
		t.Helper()
		code, rep := inspectJSON(t, ref)
		if code != 0 || !rep.Index {
			t.Fatalf("the tag: exit %d, %+v", code, rep)
		}
		for _, p := range rep.Platforms {
			if code, prep := inspectJSON(t, ref, "--platform", p); code != 0 || prep.Platform != p {
				t.Errorf("the index's %s image: exit %d, %+v", p, code, prep)
			}
		}
		return rep.Platforms
	}
	got := check()
	if !slices.Contains(got, "linux/amd64") || (!slices.Contains(got, "linux/arm64") && !slices.Contains(got, "linux/s390x")) {
		t.Fatalf("after two concurrent appends the index holds %v", got)
	}
	for _, arch := range []string{"arm64", "s390x"} {
		if !slices.Contains(got, "linux/"+arch) {
			t.Logf("the race lost linux/%s; adding it again", arch)
			importOK(t, t.TempDir(), disks[arch], ref, "--append", "--platform", "linux/"+arch)
		}
	}
	if got := check(); !slices.Equal(got, []string{"linux/amd64", "linux/arm64", "linux/s390x"}) {
		t.Errorf("the index holds %v", got)
	}
}

// pushIndexOf pushes to ref, with go-containerregistry, an OCI index
// listing the image at each entry's reference under its platform.
func pushIndexOf(t *testing.T, ref string, entries ...[2]string) {
	t.Helper()
	var idx v1.ImageIndex = mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, e := range entries {
		p, err := v1.ParsePlatform(e[0])
		if err != nil {
			t.Fatal(err)
		}
		img, err := remote.Image(mustRef(t, e[1]))
		if err != nil {
			t.Fatal(err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: p}})
	}
	if err := remote.WriteIndex(mustRef(t, ref), idx); err != nil {
		t.Fatal(err)
	}
}

func mustRef(t *testing.T, s string) name.Reference {
	t.Helper()
	r, err := name.ParseReference(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestHostileIndexesAreRefused pushes indexes imagectl would never write
// to the real registry: imagectl inspect, export and copy --platform refuse
// each (exit 3) naming what is wrong, and write nothing.
func TestHostileIndexesAreRefused(t *testing.T) {
	reg := harness.StartRegistry(t, harness.RegistryOptions{})
	cache := t.TempDir()
	amd := importOK(t, cache, makeDisk(t, t.TempDir(), 4, 1, "raw"), reg.Host+"/acme/parts:amd", "--platform", "linux/amd64")
	arm := importOK(t, cache, makeDisk(t, t.TempDir(), 8, 1, "raw"), reg.Host+"/acme/parts:arm", "--platform", "linux/arm64")
	var many [][2]string
	for range registry.MaxIndexEntries + 1 {
		many = append(many, [2]string{"linux/386", amd.Pinned})
	}
	for _, tc := range []struct {
		name    string
		entries [][2]string
		want    string
	}{
		{"lying entry", [][2]string{{"linux/amd64", amd.Pinned}, {"linux/arm64", amd.Pinned}}, "as linux/arm64, but its config says linux/amd64"},
		{"two for one platform", [][2]string{{"linux/arm64", arm.Pinned}, {"linux/arm64/v8", amd.Pinned}}, "holds 2 linux/arm64 images; it must hold one"},
		{"too many entries", many, fmt.Sprintf("lists %d manifests; imagepipe reads indexes of at most %d", registry.MaxIndexEntries+1, registry.MaxIndexEntries)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ref := reg.Host + "/acme/hostile:" + strings.ReplaceAll(tc.name, " ", "-")
			pushIndexOf(t, ref, tc.entries...)
			code, rep := inspectJSON(t, ref, "--platform", "linux/arm64")
			if code != 3 || rep.Verdict != api.VerdictRejected || len(rep.Reasons) != 1 || !strings.Contains(rep.Reasons[0].Message, tc.want) {
				t.Errorf("inspect: exit %d, %+v; want a rejection saying %q", code, rep, tc.want)
			}
			dir := t.TempDir()
			if r := imagectl(t, cache, "export", "--platform", "linux/arm64", ref, filepath.Join(dir, "out")); r.Code != 3 || !strings.Contains(r.Stderr, tc.want) || len(testenv.Entries(t, dir)) != 0 {
				t.Errorf("export: exit %d, %s", r.Code, r.Stderr)
			}
			dst := reg.Host + "/acme/copied:" + strings.ReplaceAll(tc.name, " ", "-")
			if r := imagectl(t, cache, "copy", "--platform", "linux/arm64", ref, dst); r.Code != 3 || !strings.Contains(r.Stderr, tc.want) {
				t.Errorf("copy --platform: exit %d, %s", r.Code, r.Stderr)
			}
			if tags := reg.Tags(t, "acme/copied"); slices.Contains(tags, strings.ReplaceAll(tc.name, " ", "-")) {
				t.Errorf("a refused copy wrote %s", dst)
			}
		})
	}
	// The registry itself refuses an index past its 4 MiB manifest limit,
	// the limit imagectl reads and writes indexes within.
	big := mutate.Annotations(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), map[string]string{"padding": strings.Repeat("x", registry.MaxIndexSize)}).(v1.ImageIndex)
	if err := remote.WriteIndex(mustRef(t, reg.Host+"/acme/hostile:big"), big); err == nil {
		t.Errorf("the registry took an index of more than %d bytes; imagectl's limit assumes it does not", registry.MaxIndexSize)
	}
}
