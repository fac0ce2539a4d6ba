package registry

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/imagepipe/imagepipe/pkg/api"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// manifestInfo is what the tests read of a manifest in the registry.
type manifestInfo struct {
	Digest string
	Config struct {
		Digest string `json:"digest"`
	} `json:"config"`
	Layers []struct {
		Digest string `json:"digest"`
		Size   int64  `json:"size"`
	} `json:"layers"`
	Annotations map[string]string `json:"annotations"`
}

// getManifest reads repo's manifest at reference (tag or digest) over
// plain HTTP, or returns nil when the registry has none.
func getManifest(t *testing.T, host, repo, reference string) *manifestInfo {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+host+"/v2/"+repo+"/manifests/"+reference, nil)
	req.Header.Set("Accept", "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return nil
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET manifest %s:%s: HTTP %d", repo, reference, resp.StatusCode)
	}
	var m manifestInfo
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		t.Fatal(err)
	}
	m.Digest = resp.Header.Get("Docker-Content-Digest")
	return &m
}

// deleteOnRegistry sends DELETE to a registry API path and expects 202.
func deleteOnRegistry(t *testing.T, host, path string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodDelete, "http://"+host+"/v2/"+path, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("DELETE %s: HTTP %d", path, resp.StatusCode)
	}
}

// plant pushes, with crane (another client than imagectl), a containerDisk
// of the right shape holding the attacker's disk, with the given
// annotations, to ref; it returns the planted manifest's digest.
func plant(t *testing.T, ref string, annotations map[string]string) string {
	t.Helper()
	crane := harness.Binary(t, "crane")
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	disk := bytes.Repeat([]byte("attacker"), 128<<10) // 1 MiB raw disk
	for _, h := range []*tar.Header{
		{Name: api.DiskDir, Typeflag: tar.TypeDir, Mode: 0o555, Uid: api.DiskUID, Gid: api.DiskGID},
		{Name: api.DiskPath, Typeflag: tar.TypeReg, Mode: 0o444, Uid: api.DiskUID, Gid: api.DiskGID, Size: int64(len(disk))},
	} {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
	}
	tw.Write(disk)
	tw.Close()
	layer := filepath.Join(t.TempDir(), "layer.tar")
	if err := os.WriteFile(layer, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	testenv.Run(t, crane, "append", "--oci-empty-base", "-f", layer, "-t", ref)
	args := []string{"mutate", ref, "-t", ref}
	for k, v := range annotations {
		args = append(args, "--annotation", k+"="+v)
	}
	testenv.Run(t, crane, args...)
	return strings.TrimSpace(string(testenv.Run(t, crane, "digest", ref)))
}

// TestPlantedBuildIsNotTrusted: a tenant with push access plants an image
// under the tag an honest import of a public source writes, annotated with
// that import's build key. The honest import, on a machine that never
// pushed it, builds and pushes its own image: the same digest a clean
// registry gets, and the disk it was given.
func TestPlantedBuildIsNotTrusted(t *testing.T) {
	testenv.RequireQEMU(t)
	clean := harness.StartRegistry(t, harness.RegistryOptions{})
	victim := harness.StartRegistry(t, harness.RegistryOptions{})
	qcow := makeDisk(t, t.TempDir(), 16, 3, "qcow2")
	honest := importOK(t, t.TempDir(), qcow, clean.Host+"/acme/app:1")
	key := getManifest(t, clean.Host, "acme/app", "1").Annotations[api.AnnotationBuildKey]
	if !strings.HasPrefix(key, "sha256:") {
		t.Fatalf("build key annotation %q", key)
	}

	planted := plant(t, victim.Host+"/acme/app:1",
		map[string]string{api.AnnotationBuildKey: key, api.AnnotationDiskFormat: "raw"})
	res := importOK(t, t.TempDir(), qcow, victim.Host+"/acme/app:1")
	if res.Reused || res.Digest != honest.Digest || res.UploadedBytes != res.LayerSize || res.Digest == planted {
		t.Fatalf("import over a planted build: %+v; want a fresh build of %s (planted %s)", res, honest.Digest, planted)
	}
	if got := getManifest(t, victim.Host, "acme/app", "1"); got.Digest != honest.Digest {
		t.Errorf("acme/app:1 is %s, want %s", got.Digest, honest.Digest)
	}
	disk := pullWithSkopeo(t, victim.Host+"/acme/app:1")
	testenv.Run(t, "qemu-img", "compare", "-q", "-F", "qcow2", qcow, disk)
	if tags := clean.Tags(t, "acme/app"); len(tags) != 1 || tags[0] != "1" {
		t.Errorf("the import wrote the tags %q, want only its own", tags)
	}
}

// TestReimportRebuildsWhatTheRegistryLost: a re-import on the machine that
// built the image only tags it, and rebuilds (exit 0, the whole layer
// sent, the same digest) once its layer blob or its manifest is deleted.
func TestReimportRebuildsWhatTheRegistryLost(t *testing.T) {
	testenv.RequireQEMU(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{})
	qcow := makeDisk(t, t.TempDir(), 16, 3, "qcow2")
	cache := t.TempDir()
	first := importOK(t, cache, qcow, reg.Host+"/acme/app:1")
	again := importOK(t, cache, qcow, reg.Host+"/acme/app:2")
	if !again.Reused || again.UploadedBytes != 0 || again.Digest != first.Digest {
		t.Fatalf("re-import with the build record: %+v", again)
	}
	m := getManifest(t, reg.Host, "acme/app", "1")

	deleteOnRegistry(t, reg.Host, "acme/app/blobs/"+m.Layers[0].Digest)
	rebuilt := importOK(t, cache, qcow, reg.Host+"/acme/app:3")
	if rebuilt.Reused || rebuilt.UploadedBytes != rebuilt.LayerSize || rebuilt.Digest != first.Digest {
		t.Fatalf("re-import after the layer was deleted: %+v", rebuilt)
	}
	disk := pullWithSkopeo(t, reg.Host+"/acme/app:3")
	testenv.Run(t, "qemu-img", "compare", "-q", "-F", "qcow2", qcow, disk)

	deleteOnRegistry(t, reg.Host, "acme/app/manifests/"+first.Digest)
	rebuilt = importOK(t, cache, qcow, reg.Host+"/acme/app:4")
	if rebuilt.Reused || rebuilt.Digest != first.Digest {
		t.Fatalf("re-import after the manifest was deleted: %+v", rebuilt)
	}
	if got := getManifest(t, reg.Host, "acme/app", "4"); got == nil || got.Digest != first.Digest {
		t.Errorf("acme/app:4 = %+v", got)
	}
}

// TestBuildRecordTrustedOnlyWhenPrivate forges a build record naming a
// planted image. In a cache directory others may write (or a record file
// others may write), it is ignored and the import builds; in a private
// cache, which is the user's own evidence, the same record is used, so
// the first outcome is the permission check's doing.
func TestBuildRecordTrustedOnlyWhenPrivate(t *testing.T) {
	testenv.RequireQEMU(t)
	clean := harness.StartRegistry(t, harness.RegistryOptions{})
	reg := harness.StartRegistry(t, harness.RegistryOptions{})
	qcow := makeDisk(t, t.TempDir(), 16, 3, "qcow2")
	honest := importOK(t, t.TempDir(), qcow, clean.Host+"/acme/app:1")
	key := getManifest(t, clean.Host, "acme/app", "1").Annotations[api.AnnotationBuildKey]
	planted := plant(t, reg.Host+"/acme/app:planted", map[string]string{api.AnnotationBuildKey: key})
	pm := getManifest(t, reg.Host, "acme/app", planted)

	forge := func(dirMode, fileMode os.FileMode) string {
		dir := filepath.Join(t.TempDir(), "cache")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		rec, _ := json.Marshal(map[string]any{"version": 2, "records": []map[string]any{{
			"key": key, "registry": reg.Host, "repository": "acme/app", "digest": planted,
			"config": pm.Config.Digest, "layer": pm.Layers[0].Digest, "layerSize": pm.Layers[0].Size, "storedNs": 1,
		}}})
		p := filepath.Join(dir, "builds.json")
		if err := os.WriteFile(p, rec, 0o600); err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, fileMode)
		os.Chmod(dir, dirMode)
		return dir
	}
	for _, tc := range []struct {
		name              string
		dirMode, fileMode os.FileMode
	}{{"world-writable-dir", 0o777, 0o600}, {"group-writable-file", 0o700, 0o620}} {
		t.Run(tc.name, func(t *testing.T) {
			cache := forge(tc.dirMode, tc.fileMode)
			r := importCmd(t, cache, qcow, reg.Host+"/acme/app:"+tc.name, "-v")
			if r.Code != 0 {
				t.Fatalf("exit %d: %s", r.Code, r.Stderr)
			}
			var res api.ImportResult
			if err := json.Unmarshal([]byte(r.Stdout), &res); err != nil {
				t.Fatal(err)
			}
			if res.Reused || res.Digest != honest.Digest {
				t.Errorf("with a forged record in a shared cache: %+v; want a fresh build of %s", res, honest.Digest)
			}
			if !strings.Contains(r.Stderr, "not using the cache") {
				t.Errorf("stderr does not say the cache was not used:\n%s", r.Stderr)
			}
		})
	}
	res := importOK(t, forge(0o700, 0o600), qcow, reg.Host+"/acme/app:private")
	if !res.Reused || res.Digest != planted {
		t.Errorf("with the same record in a private cache: %+v; want the recorded %s", res, planted)
	}
}
