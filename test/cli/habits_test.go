package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/imagepipe/imagepipe/pkg/api"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"

	"github.com/imagepipe/imagepipe/internal/need"
)

// imagectl runs imagectl with a private docker config directory, so that
// no credential of the machine's user leaks into the test, and the given
// standard input.
func imagectl(t *testing.T, dockerConfig, stdin string, args ...string) testenv.Result {
	t.Helper()
	return testenv.RunCommand(t, testenv.Command{
		Name:  testenv.Imagectl,
		Args:  args,
		Env:   []string{"DOCKER_CONFIG=" + dockerConfig, "IMAGEPIPE_CACHE=" + filepath.Join(dockerConfig, "cache")},
		Stdin: stdin,
	})
}

// failure decodes the JSON error object a failing command prints under -o json.
func failure(t *testing.T, r testenv.Result) api.FailureDetail {
	t.Helper()
	var f api.Failure
	if err := json.Unmarshal([]byte(r.Stdout), &f); err != nil {
		t.Fatalf("stdout of a failing command under -o json is not an error object: %v\n%s", err, r.Stdout)
	}
	if f.Error.ExitCode != r.Code {
		t.Errorf("error object says exit code %d; the process exited %d", f.Error.ExitCode, r.Code)
	}
	return f.Error
}

// TestRegistryErrorsSayWhyAndWhatToDo: credentials missing or wrong and an
// unreachable registry each get one sentence naming the host and the way
// out, never the registry's raw error body, and a reason code under -o json.
func TestRegistryErrorsSayWhyAndWhatToDo(t *testing.T) {
	testenv.RequireQEMU(t)
	dir := t.TempDir()
	disk := validQCOW2(t, dir, false)
	reg := harness.StartRegistry(t, harness.RegistryOptions{Username: "tenant", Password: "s3cret"})
	repo := reg.Host + "/acme/disk"
	ref := repo + ":1"
	cfg := t.TempDir()

	if r := imagectl(t, cfg, "s3cret\n", "import", disk, ref, "--username", "tenant", "--password-stdin"); r.Code != 0 {
		t.Fatalf("import with the right credentials: exit %d\n%s", r.Code, r.Stderr)
	}

	cases := []struct {
		name  string
		args  []string
		stdin string
		code  string
		say   []string
	}{
		{"no credentials", []string{"list", repo}, "", "unauthorized",
			[]string{reg.Host + " wants credentials", "imagectl login " + reg.Host}},
		{"wrong password", []string{"list", repo, "--username", "tenant", "--password-stdin"}, "wrong\n", "unauthorized",
			[]string{"wrong credentials for " + reg.Host}},
		{"wrong password, export", []string{"export", ref, filepath.Join(dir, "out.qcow2"), "--username", "tenant", "--password-stdin"}, "wrong\n", "unauthorized",
			[]string{"wrong credentials for " + reg.Host}},
		{"missing tag", []string{"export", ref + "-nope", filepath.Join(dir, "out.qcow2"), "--username", "tenant", "--password-stdin"}, "s3cret\n", "not-found",
			[]string{ref + "-nope", "not found"}},
		{"unreachable", []string{"list", "127.0.0.1:1/acme/disk"}, "", "unreachable",
			[]string{"127.0.0.1:1", "unreachable"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := imagectl(t, cfg, c.stdin, c.args...)
			if r.Code != 1 {
				t.Fatalf("exit %d, want 1\n%s", r.Code, r.Stderr)
			}
			for _, s := range c.say {
				if !strings.Contains(r.Stderr, s) {
					t.Errorf("stderr does not say %q:\n%s", s, r.Stderr)
				}
			}
			for _, noise := range []string{"map[", "_state=", "Class:"} {
				if strings.Contains(r.Stderr, noise) {
					t.Errorf("stderr carries the registry's raw error (%q):\n%s", noise, r.Stderr)
				}
			}
			r = imagectl(t, cfg, c.stdin, append(c.args, "-o", "json")...)
			if f := failure(t, r); f.Code != c.code {
				t.Errorf("error code %q, want %q (%+v)", f.Code, c.code, f)
			}
		})
	}
}

// TestRegistryDenialIsToldApartFromUnauthorized: a registry that knows
// the user and refuses the action (403 DENIED: zot's access control, as
// Harbor and cloud registries have it) makes imagectl say that access is
// denied, naming the user, the action and the repository, with reason
// code "denied"; not that the credentials are missing or wrong, which the
// same registry's 401 for a wrong password says with code "unauthorized".
// Both exit 1.
func TestRegistryDenialIsToldApartFromUnauthorized(t *testing.T) {
	testenv.RequireQEMU(t)
	dir := t.TempDir()
	disk := validQCOW2(t, dir, false)
	z := harness.StartZot(t, harness.ZotOptions{
		Users:  map[string]string{"pusher": "pusher-pw", "reader": "reader-pw"},
		Access: map[string]map[string][]string{"acme/**": {"pusher": {"read", "create", "update", "delete"}, "reader": {"read"}}},
	})
	ref := z.Host + "/acme/disk:1"
	cfg := t.TempDir()
	if r := imagectl(t, cfg, "pusher-pw\n", "import", disk, ref, "--username", "pusher", "--password-stdin"); r.Code != 0 {
		t.Fatalf("import as pusher: exit %d\n%s", r.Code, r.Stderr)
	}
	reader := []string{"--username", "reader", "--password-stdin"}
	if r := imagectl(t, cfg, "reader-pw\n", append([]string{"list", z.Host + "/acme/disk"}, reader...)...); r.Code != 0 || !strings.Contains(r.Stdout, "1") {
		t.Fatalf("list as reader, who may read acme: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}

	cases := []struct {
		name  string
		args  []string
		stdin string
		code  string
		say   []string
		never []string
	}{
		{"push without the right to", append([]string{"import", disk, z.Host + "/acme/disk:2"}, reader...), "reader-pw\n", "denied",
			[]string{`access denied: user "reader" may not push to`, "acme/disk"}, []string{"wants credentials", "wrong credentials"}},
		{"pull of a repository not granted", append([]string{"export", z.Host + "/globex/disk:1", filepath.Join(dir, "out.qcow2")}, reader...), "reader-pw\n", "denied",
			[]string{`access denied: user "reader" may not pull`, "globex/disk"}, []string{"wants credentials", "wrong credentials"}},
		{"wrong password", append([]string{"import", disk, z.Host + "/acme/disk:2"}, reader...), "wrong\n", "unauthorized",
			[]string{"wrong credentials for " + z.Host}, []string{"access denied"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := imagectl(t, cfg, c.stdin, c.args...)
			if r.Code != 1 {
				t.Fatalf("exit %d, want 1\n%s", r.Code, r.Stderr)
			}
			for _, s := range c.say {
				if !strings.Contains(r.Stderr, s) {
					t.Errorf("stderr does not say %q:\n%s", s, r.Stderr)
				}
			}
			for _, s := range c.never {
				if strings.Contains(r.Stderr, s) {
					t.Errorf("stderr says %q:\n%s", s, r.Stderr)
				}
			}
			r = imagectl(t, cfg, c.stdin, append(c.args, "-o", "json")...)
			if f := failure(t, r); f.Code != c.code {
				t.Errorf("error code %q, want %q (%+v)", f.Code, c.code, f)
			}
		})
	}
}

// TestLoginSavesCredentialsWhereCraneAndSkopeoReadThem: imagectl login
// checks the credentials with the registry, saves only good ones in the
// docker config, and crane and skopeo then use them; logout removes them.
func TestLoginSavesCredentialsWhereCraneAndSkopeoReadThem(t *testing.T) {
	testenv.RequireQEMU(t)
	dir := t.TempDir()
	disk := validQCOW2(t, dir, false)
	reg := harness.StartRegistry(t, harness.RegistryOptions{Username: "tenant", Password: "s3cret"})
	repo := reg.Host + "/acme/disk"
	cfg := t.TempDir()
	configFile := filepath.Join(cfg, "config.json")

	r := imagectl(t, cfg, "wrong\n", "login", reg.Host, "--username", "tenant", "--password-stdin")
	if r.Code != 1 || !strings.Contains(r.Stderr, "wrong credentials for "+reg.Host) {
		t.Fatalf("login with a wrong password: exit %d\n%s", r.Code, r.Stderr)
	}
	if b, err := os.ReadFile(configFile); err == nil && strings.Contains(string(b), reg.Host) {
		t.Fatalf("wrong credentials were saved:\n%s", b)
	}
	r = imagectl(t, cfg, "", "login", reg.Host, "--username", "tenant")
	if r.Code != 1 || !strings.Contains(r.Stderr, "needs a password") {
		t.Fatalf("login with --username, no password and no terminal: exit %d\n%s", r.Code, r.Stderr)
	}
	r = imagectl(t, cfg, "", "import", disk, repo+":1", "--username", "tenant")
	if r.Code != 1 || !strings.Contains(r.Stderr, "needs a password") {
		t.Fatalf("import with --username and no password: exit %d\n%s", r.Code, r.Stderr)
	}

	r = imagectl(t, cfg, "s3cret\n", "login", "http://"+reg.Host+"/", "--username", "tenant", "--password-stdin", "-o", "json")
	if r.Code != 0 {
		t.Fatalf("login: exit %d\n%s", r.Code, r.Stderr)
	}
	var res api.LoginResult
	if err := json.Unmarshal([]byte(r.Stdout), &res); err != nil || res.Registry != reg.Host || res.Username != "tenant" || res.ConfigFile != configFile || !res.Changed {
		t.Fatalf("login -o json: %v %+v", err, res)
	}
	if r := imagectl(t, cfg, "", "import", disk, repo+":1"); r.Code != 0 {
		t.Fatalf("import after login: exit %d\n%s", r.Code, r.Stderr)
	}
	env := []string{"DOCKER_CONFIG=" + cfg, "XDG_RUNTIME_DIR=" + t.TempDir(), "HOME=" + t.TempDir()}
	crane := testenv.RunCommand(t, testenv.Command{Name: harness.Binary(t, "crane"), Args: []string{"ls", "--insecure", repo}, Env: env})
	if crane.Code != 0 || strings.TrimSpace(crane.Stdout) != "1" {
		t.Errorf("crane ls with imagectl's login: exit %d, %q\n%s", crane.Code, crane.Stdout, crane.Stderr)
	}
	skopeo := testenv.RunCommand(t, testenv.Command{Name: "skopeo", Args: []string{"list-tags", "--tls-verify=false", "docker://" + repo}, Env: env})
	if skopeo.Code != 0 || !strings.Contains(skopeo.Stdout, `"1"`) {
		t.Errorf("skopeo list-tags with imagectl's login: exit %d, %q\n%s", skopeo.Code, skopeo.Stdout, skopeo.Stderr)
	}

	if r := imagectl(t, cfg, "", "logout", reg.Host); r.Code != 0 || !strings.Contains(r.Stdout, "Removed") {
		t.Fatalf("logout: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	if r := imagectl(t, cfg, "", "list", repo); r.Code != 1 || !strings.Contains(r.Stderr, "wants credentials") {
		t.Errorf("list after logout: exit %d\n%s", r.Code, r.Stderr)
	}
	if r := imagectl(t, cfg, "", "logout", reg.Host, "-o", "json"); r.Code != 0 || !strings.Contains(r.Stdout, `"changed": false`) {
		t.Errorf("second logout: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
}

// TestConvertNeverOverwritesItsInput: OUT naming IN, directly or through
// a link, is refused before anything is written, and IN is unchanged.
func TestConvertNeverOverwritesItsInput(t *testing.T) {
	testenv.RequireQEMU(t)
	dir := t.TempDir()
	disk := validQCOW2(t, dir, false)
	before, err := os.ReadFile(disk)
	if err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.qcow2")
	if err := os.Symlink(disk, link); err != nil {
		t.Fatal(err)
	}
	hard := filepath.Join(dir, "hard.qcow2")
	if err := os.Link(disk, hard); err != nil {
		t.Fatal(err)
	}
	for _, out := range []string{disk, "./" + filepath.Base(disk), link, hard} {
		r := testenv.RunCommand(t, testenv.Command{Name: "sh", Args: []string{"-c", `cd "$1" && exec "$2" convert "$3" "$4" --to raw -o json`, "sh", dir, testenv.Imagectl, disk, out}})
		if r.Code != 1 || !strings.Contains(r.Stderr, "is the input file") {
			t.Errorf("convert IN %s: exit %d\n%s", out, r.Code, r.Stderr)
		}
		if f := failure(t, r); f.Code != "usage" {
			t.Errorf("convert IN %s: code %q, want usage", out, f.Code)
		}
	}
	after, err := os.ReadFile(disk)
	if err != nil || string(after) != string(before) {
		t.Fatalf("the input changed (%v)", err)
	}
	if entries := testenv.Entries(t, dir); len(entries) != 4 {
		t.Errorf("files left behind: %v", entries)
	}
}

// TestExportToStandardOutput: export REF - writes the validated disk to
// standard output, in the format asked for, and nothing else.
func TestExportToStandardOutput(t *testing.T) {
	testenv.RequireQEMU(t)
	dir := t.TempDir()
	disk := validQCOW2(t, dir, false)
	reg := harness.StartRegistry(t, harness.RegistryOptions{})
	ref := reg.Host + "/acme/disk:1"
	cfg := t.TempDir()
	if r := imagectl(t, cfg, "", "import", disk, ref); r.Code != 0 {
		t.Fatalf("import: exit %d\n%s", r.Code, r.Stderr)
	}
	for _, to := range []string{"raw", "qcow2"} {
		out := filepath.Join(dir, "stdout."+to)
		r := testenv.RunCommand(t, testenv.Command{Name: "sh", Args: []string{"-c", `exec "$1" export "$2" - --to "$3" > "$4"`, "sh", testenv.Imagectl, ref, to, out},
			Env: []string{"DOCKER_CONFIG=" + cfg, "IMAGEPIPE_CACHE=" + cfg}})
		if r.Code != 0 {
			t.Fatalf("export - --to %s: exit %d\n%s", to, r.Code, r.Stderr)
		}
		testenv.Run(t, "qemu-img", "compare", "-q", "-f", "qcow2", "-F", to, disk, out)
	}
	r := imagectl(t, cfg, "", "export", ref, "-", "-o", "json")
	if r.Code != 1 || failure(t, r).Code != "usage" {
		t.Errorf("export - -o json: exit %d\n%s", r.Code, r.Stderr)
	}
}

// TestImportOfAnEmptyDiskMakesALayerEveryoneReads: an empty disk makes a
// layer of a few hundred bytes, which CDI's released importers cannot read
// (they first read 512 bytes); imagectl pads a small gzip layer to 512 bytes
// in its header, so import says nothing about it, and skopeo (decompressing
// it), crane export and imagectl export all get the disk back.
func TestImportOfAnEmptyDiskMakesALayerEveryoneReads(t *testing.T) {
	testenv.RequireQEMU(t)
	need.Program(t, "skopeo")
	crane := harness.Binary(t, "crane")
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.qcow2")
	testenv.Run(t, "qemu-img", "create", "-q", "-f", "qcow2", empty, "1G")
	reg := harness.StartRegistry(t, harness.RegistryOptions{})
	cfg := t.TempDir()
	env := []string{"DOCKER_CONFIG=" + cfg}

	for _, comp := range []string{"gzip", "zstd"} {
		t.Run(comp, func(t *testing.T) {
			ref := reg.Host + "/acme/empty-" + comp + ":1"
			r := imagectl(t, cfg, "", "import", empty, ref, "--compression", comp, "-o", "json")
			var res api.ImportResult
			if err := json.Unmarshal([]byte(r.Stdout), &res); r.Code != 0 || err != nil {
				t.Fatalf("import of an empty disk: exit %d, %v\n%s", r.Code, err, r.Stderr)
			}
			if res.LayerSize < 512 || r.Stderr != "" {
				t.Errorf("a %d-byte layer, stderr %q; want at least 512 bytes and nothing said", res.LayerSize, r.Stderr)
			}

			// skopeo decompresses the layer into a directory; the tar in it
			// holds the disk.
			out := filepath.Join(dir, comp+"-skopeo")
			if s := testenv.RunCommand(t, testenv.Command{Name: "skopeo", Args: []string{"copy", "--quiet", "--src-tls-verify=false", "--dest-decompress", "docker://" + ref, "dir:" + out}, Env: env}); s.Code != 0 {
				t.Fatalf("skopeo copy --dest-decompress: exit %d\n%s", s.Code, s.Stderr)
			}
			var m struct{ Layers []struct{ Digest string } }
			if err := json.Unmarshal(readFile(t, filepath.Join(out, "manifest.json")), &m); err != nil || len(m.Layers) != 1 {
				t.Fatalf("skopeo's manifest: %v, %+v", err, m)
			}
			extracted := filepath.Join(dir, comp+"-skopeo-x")
			testenv.Run(t, "mkdir", extracted)
			testenv.Run(t, "tar", "-xf", filepath.Join(out, strings.TrimPrefix(m.Layers[0].Digest, "sha256:")), "-C", extracted)
			testenv.Run(t, "qemu-img", "compare", "-q", "-f", "qcow2", "-F", "qcow2", empty, filepath.Join(extracted, "disk", "disk.img"))

			// skopeo copies the image as it is to another repository;
			// imagectl export reads it from there.
			copied := reg.Host + "/acme/copied-" + comp + ":1"
			if s := testenv.RunCommand(t, testenv.Command{Name: "skopeo", Args: []string{"copy", "--quiet", "--src-tls-verify=false", "--dest-tls-verify=false", "docker://" + ref, "docker://" + copied}, Env: env}); s.Code != 0 {
				t.Fatalf("skopeo copy: exit %d\n%s", s.Code, s.Stderr)
			}
			exported := filepath.Join(dir, comp+"-exported.qcow2")
			if r := imagectl(t, cfg, "", "export", copied, exported); r.Code != 0 {
				t.Fatalf("export of skopeo's copy: exit %d\n%s", r.Code, r.Stderr)
			}
			testenv.Run(t, "qemu-img", "compare", "-q", "-f", "qcow2", "-F", "qcow2", empty, exported)

			// crane export flattens the image into a tar through its own
			// decompressor.
			flat := filepath.Join(dir, comp+"-crane.tar")
			if c := testenv.RunCommand(t, testenv.Command{Name: crane, Args: []string{"export", "--insecure", ref, flat}, Env: env}); c.Code != 0 {
				t.Fatalf("crane export: exit %d\n%s", c.Code, c.Stderr)
			}
			extracted = filepath.Join(dir, comp+"-crane-x")
			testenv.Run(t, "mkdir", extracted)
			testenv.Run(t, "tar", "-xf", flat, "-C", extracted)
			testenv.Run(t, "qemu-img", "compare", "-q", "-f", "qcow2", "-F", "qcow2", empty, filepath.Join(extracted, "disk", "disk.img"))
		})
	}
	r := imagectl(t, cfg, "", "import", validQCOW2(t, dir, false), reg.Host+"/acme/data:1", "-o", "json")
	var res api.ImportResult
	if err := json.Unmarshal([]byte(r.Stdout), &res); r.Code != 0 || err != nil || r.Stderr != "" {
		t.Errorf("import of a disk with data: exit %d, %v, stderr %q", r.Code, err, r.Stderr)
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestUnreachableHubIsOneErrorWithItsCode: a hub that does not answer is
// reported once, with code "unreachable" under -o json, and client-go's
// own retry logging stays out of the way.
func TestUnreachableHubIsOneErrorWithItsCode(t *testing.T) {
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	const cfg = `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
users: [{name: u, user: {token: x}}]
`
	if err := os.WriteFile(kubeconfig, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	r := imagectl(t, dir, "", "vm", "list", "--kubeconfig", kubeconfig, "-n", "acme", "-o", "json")
	if f := failure(t, r); f.Code != "unreachable" {
		t.Errorf("code %q, want unreachable (%+v)", f.Code, f)
	}
	if lines := strings.Split(strings.TrimSpace(r.Stderr), "\n"); len(lines) != 1 {
		t.Errorf("stderr has %d lines, want the one error:\n%s", len(lines), r.Stderr)
	}
}
