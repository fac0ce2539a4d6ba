package images

import (
	"archive/tar"
	"bytes"
	"crypto/x509"
	"debug/elf"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	appsv1 "k8s.io/api/apps/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/imagepipe/imagepipe/pkg/api"
	"github.com/imagepipe/imagepipe/test/harness"

	"github.com/imagepipe/imagepipe/internal/need"
)

// version is what the test stamps into the images.
const version = "v0.0.0-imagestest"

var binaries = []string{"image-syncer", "image-gate", "imagectl"}

// pushedLine is a line `make images` prints: REF:TAG@DIGEST.
var pushedLine = regexp.MustCompile(`^(\S+/(image-syncer|image-gate|imagectl)):([\w.-]+)@(sha256:[0-9a-f]{64})$`)

// pushed is one index make printed.
type pushed struct {
	repo, tag, digest string
}

func (p pushed) ref() string { return p.repo + ":" + p.tag }

// tools are the independent clients the test reads the images with.
type tools struct {
	crane, skopeo, kubectl string
}

func (tl tools) craneOut(t *testing.T, args ...string) []byte {
	t.Helper()
	return run(t, tl.crane, append(args, "--insecure")...)
}

func run(t *testing.T, name string, args ...string) []byte {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(t.Context(), name, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, stderr.String())
	}
	return stdout.Bytes()
}

// makeImages runs a make target of the repository at root and returns the
// indexes it printed, by binary.
func makeImages(t *testing.T, root string, args ...string) map[string]pushed {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(t.Context(), "make", append([]string{"-C", root, "--no-print-directory"}, args...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("make %s: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	got := map[string]pushed{}
	for _, line := range strings.Split(stdout.String(), "\n") {
		if m := pushedLine.FindStringSubmatch(line); m != nil {
			got[m[2]] = pushed{repo: m[1], tag: m[3], digest: m[4]}
		}
	}
	if len(got) != len(binaries) {
		t.Fatalf("make %s printed %d images, want %v:\n%s", strings.Join(args, " "), len(got), binaries, stdout.String())
	}
	return got
}

// TestImages builds and pushes the images twice with make, as a provider
// does, and checks what a cluster and a provider rely on.
func TestImages(t *testing.T) {
	tl := tools{crane: harness.Binary(t, "crane"), kubectl: harness.Binary(t, "kubectl")}
	var err error
	tl.skopeo = need.Program(t, "skopeo")
	need.Program(t, "make")
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	revision := strings.TrimSpace(string(run(t, "git", "-C", root, "rev-parse", "HEAD")))
	reg := harness.StartRegistry(t, harness.RegistryOptions{})
	registry := reg.Host + "/imagepipe"

	// release-config writes into a copy of config/, never into the
	// repository's own.
	config := filepath.Join(t.TempDir(), "config")
	copyDir(t, filepath.Join(root, "config"), config)
	kustomization := filepath.Join(config, "default", "kustomization.yaml")

	first := makeImages(t, root, "release-config", "IMG_REGISTRY="+registry, "VERSION="+version,
		"IMG_TAG=first", "IMG_KUSTOMIZATION="+kustomization)
	second := makeImages(t, root, "images", "IMG_REGISTRY="+registry, "VERSION="+version, "IMG_TAG=second")

	t.Run("reproducible", func(t *testing.T) {
		for _, b := range binaries {
			if first[b].digest != second[b].digest {
				t.Errorf("%s: the second build is %s, the first %s; the same source must give the same digest", b, second[b].digest, first[b].digest)
			}
			if got := strings.TrimSpace(string(tl.craneOut(t, "digest", second[b].ref()))); got != first[b].digest {
				t.Errorf("%s serves %s, make printed %s", second[b].ref(), got, first[b].digest)
			}
		}
	})

	for _, b := range binaries {
		t.Run(b, func(t *testing.T) {
			ref := first[b].ref()
			manifests := checkIndex(t, tl, ref, first[b].digest)
			cfg := checkConfig(t, tl, ref, b, revision)

			rootfs := t.TempDir()
			headers := extract(t, tl, ref, "linux/amd64", rootfs)
			checkFilesystem(t, rootfs, headers, b)
			checkCABundle(t, filepath.Join(rootfs, "etc", "ssl", "certs", "ca-certificates.crt"))
			binary := filepath.Join(rootfs, cfg.Config.Entrypoint[0])
			checkELF(t, binary, elf.EM_X86_64)
			checkRuns(t, binary, b, revision, "linux/amd64")
			if os.Geteuid() == 0 {
				checkRunsAsImageUser(t, rootfs, cfg)
			} else {
				t.Log("not root: the binary is not run chrooted as the image's user")
			}

			arm := t.TempDir()
			extract(t, tl, ref, "linux/arm64", arm)
			checkELF(t, filepath.Join(arm, cfg.Config.Entrypoint[0]), elf.EM_AARCH64)

			checkSBOMs(t, tl, first[b].repo, b, manifests)
		})
	}

	t.Run("release-config", func(t *testing.T) {
		checkKustomize(t, tl, config, first["image-syncer"])
	})
}

// checkIndex reads ref with skopeo: an OCI index of exactly linux/amd64
// and linux/arm64 images, whose digest is what make printed. It returns
// the image descriptors.
func checkIndex(t *testing.T, tl tools, ref, digest string) []v1.Descriptor {
	t.Helper()
	raw := run(t, tl.skopeo, "inspect", "--raw", "--tls-verify=false", "docker://"+ref)
	h, _, err := v1.SHA256(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	if h.String() != digest {
		t.Errorf("skopeo reads %s as %s, make printed %s", ref, h, digest)
	}
	var idx v1.IndexManifest
	if err := json.Unmarshal(raw, &idx); err != nil {
		t.Fatalf("the index of %s: %v", ref, err)
	}
	if idx.MediaType != "application/vnd.oci.image.index.v1+json" {
		t.Errorf("%s has media type %q, want an OCI index", ref, idx.MediaType)
	}
	var platforms []string
	for _, m := range idx.Manifests {
		if m.Platform == nil {
			t.Fatalf("%s lists %s without a platform", ref, m.Digest)
		}
		platforms = append(platforms, m.Platform.String())
		if m.MediaType != "application/vnd.oci.image.manifest.v1+json" {
			t.Errorf("%s: %s has media type %q", ref, m.Platform, m.MediaType)
		}
	}
	slices.Sort(platforms)
	if !slices.Equal(platforms, []string{"linux/amd64", "linux/arm64"}) {
		t.Errorf("%s holds %v, want exactly linux/amd64 and linux/arm64", ref, platforms)
	}
	if got := idx.Annotations["org.opencontainers.image.version"]; got != version {
		t.Errorf("%s: version annotation %q, want %q", ref, got, version)
	}
	return idx.Manifests
}

// checkConfig reads the amd64 image's config with crane: a non-root user,
// the binary as the entrypoint, and the labels.
func checkConfig(t *testing.T, tl tools, ref, binary, revision string) *v1.ConfigFile {
	t.Helper()
	var cfg v1.ConfigFile
	if err := json.Unmarshal(tl.craneOut(t, "config", "--platform", "linux/amd64", ref), &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.OS != "linux" || cfg.Architecture != "amd64" {
		t.Errorf("the amd64 image's config says %s/%s", cfg.OS, cfg.Architecture)
	}
	uid, gid, ok := strings.Cut(cfg.Config.User, ":")
	if !ok || uid == "0" || uid == "" || uid == "root" || gid == "0" {
		t.Errorf("the image runs as %q; want a numeric non-root user and group", cfg.Config.User)
	}
	if _, err := strconv.Atoi(uid); err != nil {
		t.Errorf("the user %q is not numeric: Kubernetes' runAsNonRoot cannot check a name", cfg.Config.User)
	}
	if want := []string{"/usr/local/bin/" + binary}; !slices.Equal(cfg.Config.Entrypoint, want) {
		t.Fatalf("entrypoint %q, want %q", cfg.Config.Entrypoint, want)
	}
	for k, want := range map[string]string{
		"org.opencontainers.image.version":  version,
		"org.opencontainers.image.revision": revision,
		"org.opencontainers.image.title":    binary,
	} {
		if got := cfg.Config.Labels[k]; got != want {
			t.Errorf("label %s is %q, want %q", k, got, want)
		}
	}
	return &cfg
}

// extract writes the flattened root filesystem of ref's image for platform
// into dir with crane export, and returns the tar headers by path.
func extract(t *testing.T, tl tools, ref, platform, dir string) map[string]*tar.Header {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(tl.craneOut(t, "export", "--platform", platform, ref, "-")))
	headers := map[string]*tar.Header{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("reading the export of %s: %v", ref, err)
		}
		name := strings.TrimSuffix(strings.TrimPrefix(h.Name, "./"), "/")
		if !filepath.IsLocal(name) {
			t.Fatalf("the image holds the path %q outside its root", h.Name)
		}
		headers[name] = h
		p := filepath.Join(dir, name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, fs.FileMode(h.Mode).Perm())
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(f, tr); err != nil {
				t.Fatal(err)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
		default:
			t.Errorf("the image holds %q of tar type %q; only directories and regular files are expected", h.Name, h.Typeflag)
		}
	}
	// The chrooted user must be able to reach its root.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return headers
}

// checkFilesystem checks the modes and owners the image's user relies on.
func checkFilesystem(t *testing.T, rootfs string, headers map[string]*tar.Header, binary string) {
	t.Helper()
	for _, tc := range []struct {
		path     string
		mode     int64
		uid, gid int
	}{
		{"usr/local/bin/" + binary, 0o755, 0, 0},
		{"tmp", 0o1777, 0, 0},
		{"etc/passwd", 0o644, 0, 0},
		{"etc/ssl/certs/ca-certificates.crt", 0o644, 0, 0},
		{"home/nonroot", 0o700, 65532, 65532},
	} {
		h, ok := headers[tc.path]
		if !ok {
			t.Errorf("the image has no /%s", tc.path)
			continue
		}
		if h.Mode != tc.mode || h.Uid != tc.uid || h.Gid != tc.gid {
			t.Errorf("/%s is mode %o owned %d:%d, want %o owned %d:%d", tc.path, h.Mode, h.Uid, h.Gid, tc.mode, tc.uid, tc.gid)
		}
	}
	for path, want := range map[string]string{
		"etc/passwd": "nonroot:x:65532:65532:",
		"etc/group":  "nonroot:x:65532:",
	} {
		b, err := os.ReadFile(filepath.Join(rootfs, path))
		if err != nil {
			t.Error(err)
			continue
		}
		if !strings.Contains(string(b), "\n"+want) {
			t.Errorf("/%s has no line starting %q:\n%s", path, want, b)
		}
	}
}

// checkCABundle parses the bundle with crypto/x509: over 100 roots, all
// of them CAs, with a well-known one among them.
func checkCABundle(t *testing.T, path string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the CA bundle: %v", err)
	}
	var certs []*x509.Certificate
	for rest := data; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			if len(bytes.TrimSpace(rest)) > 0 {
				t.Errorf("the CA bundle has %d bytes that are not PEM", len(rest))
			}
			break
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatalf("certificate %d of the CA bundle: %v", len(certs)+1, err)
		}
		certs = append(certs, c)
	}
	if len(certs) <= 100 {
		t.Errorf("the CA bundle has %d certificates, want more than 100", len(certs))
	}
	found := false
	for _, c := range certs {
		if !c.IsCA {
			t.Errorf("%s in the CA bundle is not a CA", c.Subject)
		}
		found = found || c.Subject.CommonName == "ISRG Root X1"
	}
	if !found {
		t.Error("the CA bundle lacks ISRG Root X1 (Let's Encrypt)")
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		t.Error("x509.CertPool takes no certificate from the bundle")
	}
}

// checkELF checks that the binary is a static 64-bit ELF for machine.
func checkELF(t *testing.T, path string, machine elf.Machine) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	defer f.Close()
	if f.Machine != machine || f.Class != elf.ELFCLASS64 || f.OSABI != elf.ELFOSABI_NONE && f.OSABI != elf.ELFOSABI_LINUX {
		t.Errorf("%s is %v %v %v, want a 64-bit linux %v binary", path, f.Class, f.OSABI, f.Machine, machine)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("%s asks for a dynamic loader; the image has none", path)
		}
	}
}

// checkRuns runs the extracted binary: imagectl reports the stamped
// version; image-syncer and image-gate print their help and the stamped
// version.
func checkRuns(t *testing.T, binary, name, revision, platform string) {
	t.Helper()
	switch name {
	case "imagectl":
		var info api.VersionInfo
		out := run(t, binary, "version", "-o", "json")
		if err := json.Unmarshal(out, &info); err != nil {
			t.Fatalf("imagectl version -o json: %v\n%s", err, out)
		}
		want := api.VersionInfo{Version: version, Commit: revision, GoVersion: info.GoVersion, Platform: platform}
		if info != want || !strings.HasPrefix(info.GoVersion, "go1.") {
			t.Errorf("imagectl version -o json from the image: %+v, want %+v", info, want)
		}
	case "image-syncer", "image-gate":
		if out := run(t, binary, "--help"); !strings.Contains(string(out), name) {
			t.Errorf("%s --help:\n%s", name, out)
		}
		if out := run(t, binary, "--version"); !strings.Contains(string(out), version) {
			t.Errorf("%s --version printed %q; want the version %s", name, out, version)
		}
	}
}

// checkRunsAsImageUser runs imagectl version chrooted into the image's
// root filesystem as the image's user, with the image's environment: the
// binary needs nothing from the host, and the user can run it.
func checkRunsAsImageUser(t *testing.T, rootfs string, cfg *v1.ConfigFile) {
	t.Helper()
	uidStr, gidStr, _ := strings.Cut(cfg.Config.User, ":")
	uid, err1 := strconv.ParseUint(uidStr, 10, 32)
	gid, err2 := strconv.ParseUint(gidStr, 10, 32)
	if err1 != nil || err2 != nil {
		t.Fatalf("the user %q is not uid:gid", cfg.Config.User)
	}
	args := cfg.Config.Entrypoint
	if filepath.Base(args[0]) == "imagectl" {
		args = append(slices.Clone(args), "version", "-o", "json")
	} else {
		args = append(slices.Clone(args), "--help")
	}
	cmd := exec.CommandContext(t.Context(), args[0], args[1:]...)
	cmd.Env = cfg.Config.Env
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Chroot:     rootfs,
		Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}},
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s in the image's root as %s: %v\n%s", strings.Join(args, " "), cfg.Config.User, err, out)
	}
	if filepath.Base(args[0]) == "imagectl" && !strings.Contains(string(out), fmt.Sprintf("%q", version)) {
		t.Errorf("imagectl version as the image's user: %s", out)
	}
}

// checkSBOMs finds each image's SPDX SBOM among its referrers (the
// distribution registry has no referrers API, so in the fallback tag
// sha256-HEX of the OCI distribution specification) and reads it.
func checkSBOMs(t *testing.T, tl tools, repo, binary string, images []v1.Descriptor) {
	t.Helper()
	for _, img := range images {
		var refs v1.IndexManifest
		if err := json.Unmarshal(tl.craneOut(t, "manifest", repo+":sha256-"+img.Digest.Hex), &refs); err != nil {
			t.Fatal(err)
		}
		if len(refs.Manifests) != 1 || refs.Manifests[0].ArtifactType != "application/spdx+json" {
			t.Fatalf("the referrers of %s's %s image: %+v, want one SPDX SBOM", binary, img.Platform, refs.Manifests)
		}
		var m v1.Manifest
		if err := json.Unmarshal(tl.craneOut(t, "manifest", repo+"@"+refs.Manifests[0].Digest.String()), &m); err != nil {
			t.Fatal(err)
		}
		if m.Subject == nil || m.Subject.Digest != img.Digest || len(m.Layers) != 1 {
			t.Fatalf("the SBOM manifest %+v does not name %s as its subject with one blob", m, img.Digest)
		}
		var doc struct {
			SPDXVersion string `json:"spdxVersion"`
			Packages    []struct {
				Name        string `json:"name"`
				VersionInfo string `json:"versionInfo"`
			} `json:"packages"`
		}
		if err := json.Unmarshal(tl.craneOut(t, "blob", repo+"@"+m.Layers[0].Digest.String()), &doc); err != nil {
			t.Fatal(err)
		}
		pkgs := map[string]string{}
		for _, p := range doc.Packages {
			pkgs[p.Name] = p.VersionInfo
		}
		if doc.SPDXVersion != "SPDX-2.3" || pkgs[binary] != version || pkgs["github.com/google/go-containerregistry"] == "" {
			t.Errorf("the SBOM of %s's %s image is %s with %d packages (%s %q, go-containerregistry %q)",
				binary, img.Platform, doc.SPDXVersion, len(doc.Packages), binary, pkgs[binary], pkgs["github.com/google/go-containerregistry"])
		}
	}
}

// checkKustomize renders the copy of config/default that release-config
// pinned: the Deployment runs the pushed index by digest, with the
// image's entrypoint, as the image's non-root user.
func checkKustomize(t *testing.T, tl tools, config string, syncer pushed) {
	t.Helper()
	out := run(t, tl.kubectl, "kustomize", filepath.Join(config, "default"))
	var cfg v1.ConfigFile
	if err := json.Unmarshal(tl.craneOut(t, "config", "--platform", "linux/amd64", syncer.repo+"@"+syncer.digest), &cfg); err != nil {
		t.Fatal(err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	var dep *appsv1.Deployment
	for {
		var obj appsv1.Deployment
		if err := dec.Decode(&obj); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if obj.Kind == "Deployment" && obj.Name == "image-syncer" {
			dep = &obj
		}
	}
	if dep == nil {
		t.Fatalf("kubectl kustomize renders no image-syncer Deployment:\n%s", out)
	}
	c := dep.Spec.Template.Spec.Containers[0]
	if want := syncer.repo + "@" + syncer.digest; c.Image != want {
		t.Errorf("the Deployment runs %q, want %q", c.Image, want)
	}
	if !slices.Equal(c.Command, cfg.Config.Entrypoint) {
		t.Errorf("the Deployment's command %q is not the image's entrypoint %q", c.Command, cfg.Config.Entrypoint)
	}
	sc := dep.Spec.Template.Spec.SecurityContext
	uid, _, _ := strings.Cut(cfg.Config.User, ":")
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || strconv.FormatInt(*sc.RunAsUser, 10) != uid {
		t.Errorf("the pod's securityContext %+v; want runAsNonRoot and runAsUser %s, the image's user", sc, uid)
	}
}

// copyDir copies the regular files under src to dst.
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		t.Fatalf("copying %s: %v", src, err)
	}
}
