package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/imagepipe/imagepipe/pkg/api"
)

// pushedImage is what a registry holds at a reference: the manifest's
// digest and annotations, and the image config.
type pushedImage struct {
	digest      string
	annotations map[string]string
	config      *v1.ConfigFile
}

// readPushed reads the manifest and the config at ref from the registry,
// as any OCI client (here go-containerregistry) sees them.
func readPushed(t *testing.T, ref string) pushedImage {
	t.Helper()
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(r, remote.WithContext(t.Context()))
	if err != nil {
		t.Fatalf("reading %s: %v", ref, err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatalf("reading the manifest of %s: %v", ref, err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatalf("reading the config of %s: %v", ref, err)
	}
	return pushedImage{digest: d.String(), annotations: m.Annotations, config: cfg}
}

// importJSON runs imagectl import -o json in-process and decodes its
// result, failing the test on any other outcome.
func importJSON(t *testing.T, args ...string) api.ImportResult {
	t.Helper()
	r := runReported(t, append(append([]string{"import"}, args...), "-o", "json", "-q")...)
	if r.code != exitOK {
		t.Fatalf("imagectl import %v: exit %d: %v\n%s", args, r.code, r.err, r.stdout)
	}
	var res api.ImportResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatalf("imagectl import %v -o json printed %q: %v", args, r.stdout, err)
	}
	return res
}

// TestImportFlagsChangeTheImage: --os-name, --created and --label each
// change the pushed image the way the user asked (the OS name as the
// io.imagepipe.os.name annotation and label, the time as the OCI created
// annotation and label and the config's created, the label in the
// config's labels), an import without them records none of it, and a
// build with a flag is a new image rather than a reuse of the one built
// from the same disk without it. The same import again is reused, so the
// builds are reproducible and reuse is in play.
func TestImportFlagsChangeTheImage(t *testing.T) {
	t.Setenv("IMAGEPIPE_CACHE", t.TempDir())
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	reg := startRegistry(t)
	disk := filepath.Join(t.TempDir(), "disk.raw")
	if err := os.WriteFile(disk, bytes.Repeat([]byte("imagepipe"), 1<<17)[:1<<20], 0o644); err != nil {
		t.Fatal(err)
	}
	repo := reg + "/acme/disk"

	plain := importJSON(t, disk, repo+":plain")
	base := readPushed(t, repo+":plain")
	if plain.Reused || base.digest != plain.Digest {
		t.Fatalf("first import: reused %v, digest %s, registry holds %s; want a new image, the one reported", plain.Reused, plain.Digest, base.digest)
	}
	for _, key := range []string{api.AnnotationOSName, api.AnnotationCreated} {
		if v, ok := base.annotations[key]; ok {
			t.Errorf("import without flags: manifest annotation %s=%q; want none", key, v)
		}
		if v, ok := base.config.Config.Labels[key]; ok {
			t.Errorf("import without flags: config label %s=%q; want none", key, v)
		}
	}
	if !base.config.Created.IsZero() {
		t.Errorf("import without flags: config created %s; want none, so that the image is reproducible", base.config.Created)
	}
	if again := importJSON(t, disk, repo+":again"); !again.Reused || again.Digest != plain.Digest {
		t.Fatalf("the same import again: reused %v, digest %s; want the image %s reused", again.Reused, again.Digest, plain.Digest)
	}

	created := time.Date(2024, 5, 1, 12, 30, 0, 0, time.UTC)
	for _, tc := range []struct {
		flag  []string
		check func(t *testing.T, img pushedImage)
	}{
		{[]string{"--os-name", "fedora-41"}, func(t *testing.T, img pushedImage) {
			if got := img.annotations[api.AnnotationOSName]; got != "fedora-41" {
				t.Errorf("manifest annotation %s = %q; want fedora-41", api.AnnotationOSName, got)
			}
			if got := img.config.Config.Labels[api.AnnotationOSName]; got != "fedora-41" {
				t.Errorf("config label %s = %q; want fedora-41", api.AnnotationOSName, got)
			}
		}},
		{[]string{"--created", "2024-05-01T14:30:00+02:00"}, func(t *testing.T, img pushedImage) {
			if got := img.annotations[api.AnnotationCreated]; got != "2024-05-01T12:30:00Z" {
				t.Errorf("manifest annotation %s = %q; want 2024-05-01T12:30:00Z", api.AnnotationCreated, got)
			}
			if got := img.config.Config.Labels[api.AnnotationCreated]; got != "2024-05-01T12:30:00Z" {
				t.Errorf("config label %s = %q; want 2024-05-01T12:30:00Z", api.AnnotationCreated, got)
			}
			if !img.config.Created.Time.Equal(created) {
				t.Errorf("config created %s; want %s", img.config.Created.Time, created)
			}
		}},
		{[]string{"--label", "team=web", "--label", "tier=gold=1"}, func(t *testing.T, img pushedImage) {
			for k, want := range map[string]string{"team": "web", "tier": "gold=1"} {
				if got, ok := img.config.Config.Labels[k]; !ok || got != want {
					t.Errorf("config label %s = %q (present %v); want %q", k, got, ok, want)
				}
			}
		}},
	} {
		t.Run(tc.flag[0], func(t *testing.T) {
			ref := repo + ":" + tc.flag[0][2:]
			res := importJSON(t, append([]string{disk, ref}, tc.flag...)...)
			img := readPushed(t, ref)
			if res.Reused || res.Digest == plain.Digest || img.digest == base.digest {
				t.Errorf("import %v: reused %v, digest %s (registry %s); want a new image, not %s built without the flag",
					tc.flag, res.Reused, res.Digest, img.digest, plain.Digest)
			}
			tc.check(t, img)
		})
	}
}
