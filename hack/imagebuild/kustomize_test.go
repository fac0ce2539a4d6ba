package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestPinImage(t *testing.T) {
	const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	for _, tc := range []struct {
		name, in, want string
	}{
		{"replaces the tag and keeps comments", `# header comment
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../crd
images:
  # the syncer
  - name: ghcr.io/imagepipe/image-syncer
    newName: ghcr.io/imagepipe/image-syncer
    newTag: latest
  - name: other
    newTag: v1
`, `# header comment
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../crd
images:
  # the syncer
  - name: ghcr.io/imagepipe/image-syncer
    newName: reg.example/imagepipe/image-syncer
    digest: ` + digest + `
  - name: other
    newTag: v1
`},
		{"adds images", "kind: Kustomization\nresources:\n  - ../syncer\n", `kind: Kustomization
resources:
  - ../syncer
images:
  - name: ghcr.io/imagepipe/image-syncer
    newName: reg.example/imagepipe/image-syncer
    digest: ` + digest + "\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "kustomization.yaml")
			if err := os.WriteFile(p, []byte(tc.in), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := pinImage(p, "ghcr.io/imagepipe/image-syncer", "reg.example/imagepipe/image-syncer", digest); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Errorf("got\n%s\nwant\n%s", got, tc.want)
			}
		})
	}
}

func TestPinImageRefuses(t *testing.T) {
	dir := t.TempDir()
	good := "sha256:" + strings.Repeat("a", 64)
	for _, tc := range []struct{ name, content, digest string }{
		{"not a digest", "kind: Kustomization\n", "sha256:abc"},
		{"images not a list", "images: {}\n", good},
		{"not a mapping", "- a\n", good},
		{"not YAML", "images: [\n", good},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-"))
			if err := os.WriteFile(p, []byte(tc.content), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := pinImage(p, "x", "y", tc.digest); err == nil {
				t.Error("pinImage succeeded")
			}
			if got, _ := os.ReadFile(p); string(got) != tc.content {
				t.Errorf("the file changed to %q", got)
			}
		})
	}
	if err := pinImage(filepath.Join(dir, "missing"), "x", "y", good); err == nil {
		t.Error("pinImage of a missing file succeeded")
	}
}
