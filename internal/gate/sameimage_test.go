package gate

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/klauspost/compress/zstd"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/imagepipe/imagepipe/internal/containerdisk"
	"github.com/imagepipe/imagepipe/internal/convert"
	"github.com/imagepipe/imagepipe/internal/publish"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// TestImagectlImageIsGatesCanonicalImage: the image imagectl import
// pushes of a disk and the canonical image the gate publishes of the same
// disk, pushed by another tool in a layer of its own with imagectl's
// config values and annotations, are byte for byte the same manifest and
// config, for each disk format and compression. The gate rebuilds this
// canonical image itself (the pushed layer is not imagepipe's), so the
// two images are assembled on the two paths.
func TestImagectlImageIsGatesCanonicalImage(t *testing.T) {
	e := newEnv(t)
	disk := rawDisk(t, 4<<20, 5)
	for _, format := range []convert.Format{convert.FormatQCOW2, convert.FormatRaw} {
		for _, comp := range []containerdisk.Compression{containerdisk.CompressionGzip, containerdisk.CompressionZstd, containerdisk.CompressionNone} {
			t.Run(fmt.Sprintf("%s-%s", format, comp), func(t *testing.T) {
				repo := fmt.Sprintf("acme/built-%s-%s", format, comp)
				built := e.importDisk(t, repo, disk, containerdisk.Options{DiskFormat: format, Compression: comp},
					publish.ImportOptions{Labels: map[string]string{"team": "os"}, DefaultInstancetype: "u1.small", DefaultPreference: "fedora",
						Created: time.Unix(1700000000, 0), OSName: "fedora-41", Creator: "imagectl test", Architecture: "arm64", Variant: "v8"})
				manifest, config, layer := e.readImage(t, repo, built)
				var m ocispec.Manifest
				var cfg ocispec.Image
				if err := json.Unmarshal(manifest, &m); err != nil {
					t.Fatal(err)
				}
				if err := json.Unmarshal(config, &cfg); err != nil {
					t.Fatal(err)
				}

				// The same disk, in another tool's tar and compression.
				lr, err := containerdisk.OpenLayer(m.Layers[0].MediaType, bytes.NewReader(layer))
				if err != nil {
					t.Fatal(err)
				}
				var pushedDisk bytes.Buffer
				if _, err := lr.CopyDisk(t.Context(), &pushedDisk); err != nil {
					t.Fatal(err)
				}
				lr.Close()
				tarball := foreignTar(pushedDisk.Bytes())
				other := "acme/other-" + string(format) + "-" + string(comp)
				pushed := (&crafted{layer: compressLike(t, comp, tarball), layerMediaType: m.Layers[0].MediaType,
					diffID: digest.FromBytes(tarball).String(), config: cfg, annotations: m.Annotations}).push(t, e, other)
				if pushed == built {
					t.Fatal("the other tool's image is imagectl's")
				}
				v := e.verify(t, other, pushed)
				if v.Verdict != api.VerdictAccepted || len(v.Images) != 1 {
					t.Fatalf("%+v; want accepted", v)
				}
				if got := v.Images[0].Canonical; got != built {
					t.Fatalf("the gate's canonical image is %s; imagectl pushed %s", got, built)
				}
				cm, cc, cl := e.readImage(t, other, v.Images[0].Canonical)
				if !bytes.Equal(cm, manifest) || !bytes.Equal(cc, config) || !bytes.Equal(cl, layer) {
					t.Errorf("the canonical image differs from imagectl's: manifest %v, config %v, layer %v",
						bytes.Equal(cm, manifest), bytes.Equal(cc, config), bytes.Equal(cl, layer))
				}
			})
		}
	}
}

// readImage reads the manifest repo@d, its config and its one layer.
func (e *env) readImage(t *testing.T, repo, d string) (manifest, config, layer []byte) {
	t.Helper()
	ref, err := name.NewDigest(e.host + "/" + repo + "@" + d)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := e.reg.FetchManifest(t.Context(), ref)
	if err != nil {
		t.Fatal(err)
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(raw.Bytes, &m); err != nil || len(m.Layers) != 1 {
		t.Fatalf("the manifest %s: %v, %s", d, err, raw.Bytes)
	}
	read := func(d digest.Digest) []byte {
		rc, err := e.reg.OpenBlob(t.Context(), ref.Context(), d.String())
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		b, err := io.ReadAll(rc)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	return raw.Bytes, read(m.Config.Digest), read(m.Layers[0].Digest)
}

// compressLike compresses tarball as another tool would in comp: Go's
// gzip or klauspost's zstd encoder with their defaults, or not at all.
func compressLike(t *testing.T, comp containerdisk.Compression, tarball []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	var w io.WriteCloser
	switch comp {
	case containerdisk.CompressionNone:
		return tarball
	case containerdisk.CompressionGzip:
		w = gzip.NewWriter(&b)
	case containerdisk.CompressionZstd:
		enc, err := zstd.NewWriter(&b)
		if err != nil {
			t.Fatal(err)
		}
		w = enc
	}
	if _, err := w.Write(tarball); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}
