package diskimage

import (
	"encoding/json"
	"time"

	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Config is what a containerDisk's image config says besides the diff ID
// of its layer.
type Config struct {
	// Platform is the image's: only OS, Architecture and Variant are
	// written.
	Platform ocispec.Platform
	// Created, when set, is written as it is; nil writes no time, which
	// keeps an image reproducible.
	Created *time.Time
	// Labels and Env are the config's labels and environment (CDI reads
	// its volume labels from the environment).
	Labels map[string]string
	Env    []string
}

// Image is an assembled image: the bytes of its config and manifest.
type Image struct {
	// Config is the config blob and ConfigDesc its descriptor.
	Config     []byte
	ConfigDesc ocispec.Descriptor
	// Manifest is the OCI image manifest and Digest its digest.
	Manifest []byte
	Digest   string
}

// Assemble builds the config of cfg around a layer whose tar has digest
// diffID, and the OCI image manifest naming that config, layer (its
// descriptor as given) and annotations.
func Assemble(cfg Config, layer ocispec.Descriptor, diffID string, annotations map[string]string) (*Image, error) {
	config, err := json.Marshal(ocispec.Image{
		Created:  cfg.Created,
		Platform: ocispec.Platform{Architecture: cfg.Platform.Architecture, OS: cfg.Platform.OS, Variant: cfg.Platform.Variant},
		Config:   ocispec.ImageConfig{Labels: cfg.Labels, Env: cfg.Env},
		RootFS:   ocispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{digest.Digest(diffID)}},
	})
	if err != nil {
		return nil, err
	}
	configDesc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageConfig, Digest: digest.FromBytes(config), Size: int64(len(config))}
	manifest, err := json.Marshal(ocispec.Manifest{
		Versioned:   specs.Versioned{SchemaVersion: 2},
		MediaType:   ocispec.MediaTypeImageManifest,
		Config:      configDesc,
		Layers:      []ocispec.Descriptor{layer},
		Annotations: annotations,
	})
	if err != nil {
		return nil, err
	}
	return &Image{Config: config, ConfigDesc: configDesc, Manifest: manifest, Digest: digest.FromBytes(manifest).String()}, nil
}
