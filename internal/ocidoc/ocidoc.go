package ocidoc

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/imagepipe/imagepipe/internal/reject"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// Limits on the documents of a pushed image, checked before they are used.
const (
	// MaxConfigSize bounds an image config: imagectl's are under 2 KiB.
	MaxConfigSize = 1 << 20
	// maxAnnotations and maxLabels bound the maps copied into the
	// canonical manifest and config.
	maxAnnotations = 64
	maxLabels      = 256
	maxMapText     = 4096
)

// Media types of manifests and configs the gate reads.
const (
	dockerManifest     = "application/vnd.docker.distribution.manifest.v2+json"
	dockerManifestList = "application/vnd.docker.distribution.manifest.list.v2+json"
	dockerConfig       = "application/vnd.docker.container.image.v1+json"
)

// Document is the part of a manifest or index the gate reads. Fields a
// reader could use to find bytes elsewhere are read so that they can be
// refused.
type Document struct {
	SchemaVersion int                 `json:"schemaVersion"`
	MediaType     string              `json:"mediaType"`
	ArtifactType  string              `json:"artifactType"`
	Config        *Descriptor         `json:"config"`
	Layers        []Descriptor        `json:"layers"`
	Manifests     []Descriptor        `json:"manifests"`
	Annotations   map[string]string   `json:"annotations"`
	Subject       *ocispec.Descriptor `json:"subject"`
}

// Descriptor is a descriptor with the fields that would point a reader
// elsewhere than the blob.
type Descriptor struct {
	ocispec.Descriptor
	// Data and URLs are refused: CDI's importer fetches a layer's urls
	// from inside the hub instead of the blob, and go-containerregistry
	// serves embedded data instead of the blob.
	Data json.RawMessage `json:"data"`
}

// ParseDocument reads b as a manifest or index and checks that
// contentType, the registry's Content-Type, and the body's mediaType agree (CDI's importer
// goes by the former, most clients by the latter) and that no JSON key
// appears twice or in another case than the specification's (Go's decoder
// takes the last of duplicates, and any case; other parsers differ).
func ParseDocument(contentType string, b []byte) (*Document, error) {
	if err := checkJSONKeys(b); err != nil {
		return nil, err
	}
	var doc Document
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, reject.New(reject.ManifestShape, "the manifest is not valid JSON: %v", err)
	}
	if doc.SchemaVersion != 2 {
		return nil, reject.New(reject.ManifestShape, "the manifest's schemaVersion is %d, not 2", doc.SchemaVersion)
	}
	if doc.MediaType != contentType {
		return nil, reject.New(reject.ManifestShape, "the registry serves the manifest as %q but its mediaType says %q", contentType, doc.MediaType)
	}
	switch doc.MediaType {
	case ocispec.MediaTypeImageIndex, dockerManifestList:
		if doc.Config != nil || doc.Layers != nil {
			return nil, reject.New(reject.ManifestShape, "the index also has a config or layers")
		}
	case ocispec.MediaTypeImageManifest, dockerManifest:
		if doc.Manifests != nil {
			return nil, reject.New(reject.ManifestShape, "the image manifest also lists manifests")
		}
		if doc.ArtifactType != "" {
			return nil, reject.New(reject.ManifestShape, "the manifest is an artifact of type %q, not an image", doc.ArtifactType)
		}
		if doc.Config == nil {
			return nil, reject.New(reject.ManifestShape, "the image manifest has no config")
		}
	default:
		return nil, reject.New(reject.ManifestShape, "the media type %q is not an image manifest or index", doc.MediaType)
	}
	for _, d := range append(append([]Descriptor{}, doc.Layers...), doc.Manifests...) {
		if err := d.check(); err != nil {
			return nil, err
		}
	}
	if doc.Config != nil {
		if err := doc.Config.check(); err != nil {
			return nil, err
		}
	}
	if err := checkMap("annotation", doc.Annotations, maxAnnotations); err != nil {
		return nil, err
	}
	return &doc, nil
}

// IsIndex reports whether d lists manifests.
func (d *Document) IsIndex() bool {
	return d.MediaType == ocispec.MediaTypeImageIndex || d.MediaType == dockerManifestList
}

func (d Descriptor) check() error {
	if len(d.URLs) > 0 {
		return reject.New(reject.ManifestShape, "the descriptor of %s names urls %q; importers would fetch them instead of the blob", d.Digest, d.URLs)
	}
	if len(d.Data) > 0 && !bytes.Equal(d.Data, []byte("null")) {
		return reject.New(reject.ManifestShape, "the descriptor of %s embeds data; clients would read it instead of the blob", d.Digest)
	}
	if d.Digest.Validate() != nil || d.Digest.Algorithm() != "sha256" {
		return reject.New(reject.ManifestShape, "the descriptor's digest %q is not a valid sha256 digest", d.Digest)
	}
	if d.Size < 0 {
		return reject.New(reject.ManifestShape, "the descriptor of %s has the negative size %d", d.Digest, d.Size)
	}
	return nil
}

// checkMap bounds a map of annotations or labels copied into the
// canonical image.
func checkMap(what string, m map[string]string, limit int) error {
	if len(m) > limit {
		return reject.New(reject.ManifestShape, "the image has %d %ss, over the limit of %d", len(m), what, limit)
	}
	for k, v := range m {
		if len(k) > 253 || len(v) > maxMapText || k == "" {
			return reject.New(reject.ManifestShape, "the %s %.64q is empty or too long", what, k)
		}
	}
	return nil
}

// checkJSONKeys refuses an object with a key twice, or a key that differs
// only in case from another spelling Go's decoder would match.
func checkJSONKeys(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var walk func() error
	walk = func() error {
		tok, err := dec.Token()
		if err != nil {
			return reject.New(reject.ManifestShape, "the document is not valid JSON: %v", err)
		}
		switch tok {
		case json.Delim('{'):
			seen := map[string]bool{}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return reject.New(reject.ManifestShape, "the document is not valid JSON: %v", err)
				}
				k := strings.ToLower(kt.(string))
				if seen[k] {
					return reject.New(reject.ManifestShape, "the key %q appears twice in one object; readers disagree on which counts", kt)
				}
				seen[k] = true
				if err := walk(); err != nil {
					return err
				}
			}
			_, err = dec.Token()
		case json.Delim('['):
			for dec.More() {
				if err := walk(); err != nil {
					return err
				}
			}
			_, err = dec.Token()
		}
		if err != nil {
			return reject.New(reject.ManifestShape, "the document is not valid JSON: %v", err)
		}
		return nil
	}
	if err := walk(); err != nil {
		return err
	}
	if _, err := dec.Token(); err == nil {
		return reject.New(reject.ManifestShape, "the document holds more than one JSON value")
	}
	return nil
}

// archPattern is what an architecture or variant name may look like.
var archPattern = regexp.MustCompile(`^[a-z0-9_]{1,32}$`)

// LinuxPlatform reports whether p is a linux platform with an architecture
// and variant of the shape ParseConfig accepts.
func LinuxPlatform(p ocispec.Platform) bool {
	return p.OS == "linux" && archPattern.MatchString(p.Architecture) && (p.Variant == "" || archPattern.MatchString(p.Variant))
}

// ParseConfig reads a pushed image config: linux, a valid architecture,
// one diff ID, bounded labels, and only the environment variables CDI
// reads (KubeVirt's instancetype defaults), each a valid name.
func ParseConfig(b []byte, mediaType string) (*ocispec.Image, error) {
	if mediaType != ocispec.MediaTypeImageConfig && mediaType != dockerConfig {
		return nil, reject.New(reject.ManifestShape, "the config's media type %q is not an image config", mediaType)
	}
	if err := checkJSONKeys(b); err != nil {
		return nil, err
	}
	var cfg ocispec.Image
	if err := json.Unmarshal(b, &cfg); err != nil {
		return nil, reject.New(reject.ManifestShape, "the image config is not valid: %v", err)
	}
	if !LinuxPlatform(cfg.Platform) {
		return nil, reject.New(reject.ManifestShape, "the image config's platform %q/%q is not a linux platform", cfg.OS, cfg.Architecture)
	}
	if cfg.RootFS.Type != "layers" || len(cfg.RootFS.DiffIDs) != 1 {
		return nil, reject.New(reject.ManifestShape, "the image config lists %d diff IDs; a containerDisk has one layer", len(cfg.RootFS.DiffIDs))
	}
	if err := checkMap("label", cfg.Config.Labels, maxLabels); err != nil {
		return nil, err
	}
	for _, kv := range cfg.Config.Env {
		k, v, _ := strings.Cut(kv, "=")
		if k != api.EnvDefaultInstancetype && k != api.EnvDefaultPreference {
			return nil, reject.New(reject.ManifestShape, "the image config sets %q; a containerDisk sets only %s and %s", k, api.EnvDefaultInstancetype, api.EnvDefaultPreference)
		}
		if !namePattern.MatchString(v) {
			return nil, reject.New(reject.ManifestShape, "%s is %q, not a Kubernetes object name", k, v)
		}
	}
	return &cfg, nil
}

// namePattern is a DNS-1123 subdomain, the name of an instancetype.
var namePattern = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$`)

// PlatformString is p as "os/arch[/variant]".
func PlatformString(p ocispec.Platform) string {
	s := p.OS + "/" + p.Architecture
	if p.Variant != "" {
		s += "/" + p.Variant
	}
	return s
}
