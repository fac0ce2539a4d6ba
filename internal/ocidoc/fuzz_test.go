package ocidoc

import (
	"encoding/json"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// FuzzParseDocument feeds manifests, indexes and configs to the strict
// readers: no input panics, and what they accept keeps the
// promises the verifier relies on.
func FuzzParseDocument(f *testing.F) {
	cfg := `{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":["sha256:` + "aa" + `"]}}`
	m := `{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:0000000000000000000000000000000000000000000000000000000000000000","size":2},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:1111111111111111111111111111111111111111111111111111111111111111","size":3,"urls":["http://x"]}]}`
	idx := `{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:2222222222222222222222222222222222222222222222222222222222222222","size":4,"platform":{"os":"linux","architecture":"amd64"}}]}`
	for _, s := range []string{cfg, m, idx, `{"schemaVersion":2,"schemaVersion":3}`, `{"a":{"b":[1,{"B":2,"b":3}]}}`, `[]`, `{} {}`} {
		f.Add([]byte(s), ocispec.MediaTypeImageManifest)
		f.Add([]byte(s), ocispec.MediaTypeImageIndex)
		f.Add([]byte(s), ocispec.MediaTypeImageConfig)
	}
	f.Fuzz(func(t *testing.T, b []byte, mediaType string) {
		if len(b) > 1<<16 {
			return
		}
		doc, err := ParseDocument(mediaType, b)
		if err == nil {
			if doc.MediaType != mediaType || doc.SchemaVersion != 2 {
				t.Fatalf("accepted %q served as %q", doc.MediaType, mediaType)
			}
			for _, d := range append(doc.Layers, doc.Manifests...) {
				if len(d.URLs) > 0 || (len(d.Data) > 0 && string(d.Data) != "null") {
					t.Fatalf("accepted a descriptor with urls or data: %+v", d)
				}
			}
			if !doc.IsIndex() && (doc.Config == nil || doc.Manifests != nil) {
				t.Fatalf("accepted an image manifest without a config or with manifests")
			}
			var again map[string]any
			if json.Unmarshal(b, &again) != nil {
				t.Fatalf("accepted invalid JSON")
			}
		}
		if cfg, err := ParseConfig(b, ocispec.MediaTypeImageConfig); err == nil {
			if cfg.OS != "linux" || len(cfg.RootFS.DiffIDs) != 1 {
				t.Fatalf("accepted config %+v", cfg)
			}
		}
	})
}
