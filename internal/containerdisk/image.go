package containerdisk

import (
	"encoding/json"
	"time"

	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// ImageConfig is what a containerDisk's image config says besides the
// diff ID of its layer.
type ImageConfig struct {
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

// Image is an assembled containerDisk image: the bytes of its config and
// manifest. AssembleImage is the one place that decides them, so that the
// image imagectl import pushes and the canonical image the gate publishes
// of the same disk, with the same config values and annotations, are byte
// for byte the same image. It adds nothing of its own: no time, no
// defaults, no labels.
type Image struct {
	// Config is the config blob and ConfigDesc its descriptor.
	Config     []byte
	ConfigDesc ocispec.Descriptor
	// Manifest is the OCI image manifest and Digest its digest.
	Manifest []byte
	Digest   string
}

// AssembleImage builds the config of cfg around a layer whose tar has digest
// diffID, and the OCI image manifest naming that config, layer (its
// descriptor as given) and annotations.
func AssembleImage(cfg ImageConfig, layer ocispec.Descriptor, diffID string, annotations map[string]string) (*Image, error) {
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
