package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"

	"debug/buildinfo"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Media types of the SBOM artifact.
const (
	spdxMediaType  = "application/spdx+json"
	emptyMediaType = "application/vnd.oci.empty.v1+json"
)

// spdxDocument is the part of SPDX 2.3 (JSON) that an SBOM of a Go binary
// fills: the binary as the described package and every module linked
// into it, with the Go toolchain, as packages it depends on.
type spdxDocument struct {
	SPDXVersion       string             `json:"spdxVersion"`
	DataLicense       string             `json:"dataLicense"`
	SPDXID            string             `json:"SPDXID"`
	Name              string             `json:"name"`
	DocumentNamespace string             `json:"documentNamespace"`
	CreationInfo      spdxCreationInfo   `json:"creationInfo"`
	Packages          []spdxPackage      `json:"packages"`
	Relationships     []spdxRelationship `json:"relationships"`
}

type spdxCreationInfo struct {
	Created  string   `json:"created"`
	Creators []string `json:"creators"`
}

type spdxPackage struct {
	Name             string            `json:"name"`
	SPDXID           string            `json:"SPDXID"`
	VersionInfo      string            `json:"versionInfo,omitempty"`
	DownloadLocation string            `json:"downloadLocation"`
	FilesAnalyzed    bool              `json:"filesAnalyzed"`
	LicenseConcluded string            `json:"licenseConcluded"`
	LicenseDeclared  string            `json:"licenseDeclared"`
	CopyrightText    string            `json:"copyrightText"`
	PrimaryPurpose   string            `json:"primaryPackagePurpose,omitempty"`
	ExternalRefs     []spdxExternalRef `json:"externalRefs,omitempty"`
}

type spdxExternalRef struct {
	Category string `json:"referenceCategory"`
	Type     string `json:"referenceType"`
	Locator  string `json:"referenceLocator"`
}

type spdxRelationship struct {
	Element string `json:"spdxElementId"`
	Type    string `json:"relationshipType"`
	Related string `json:"relatedSpdxElement"`
}

// sbom is the SPDX document of the binary at path, which img carries.
func sbom(img v1.Image, binary, arch, path string, o options, created time.Time) ([]byte, error) {
	bi, err := buildinfo.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the build information of %s: %w", path, err)
	}
	digest, err := img.Digest()
	if err != nil {
		return nil, err
	}
	purl := func(path, version string) []spdxExternalRef {
		return []spdxExternalRef{{Category: "PACKAGE-MANAGER", Type: "purl", Locator: "pkg:golang/" + path + "@" + version}}
	}
	pkg := func(id, name, version, location string) spdxPackage {
		return spdxPackage{Name: name, SPDXID: id, VersionInfo: version, DownloadLocation: location,
			LicenseConcluded: "NOASSERTION", LicenseDeclared: "NOASSERTION", CopyrightText: "NOASSERTION"}
	}
	main := pkg("SPDXRef-Package-main", binary, o.version, o.source)
	main.PrimaryPurpose = "APPLICATION"
	main.ExternalRefs = purl(bi.Path, o.version)
	goPkg := pkg("SPDXRef-Package-go", "go", bi.GoVersion, "NOASSERTION")
	goPkg.ExternalRefs = purl("stdlib", bi.GoVersion)
	doc := spdxDocument{
		SPDXVersion: "SPDX-2.3",
		DataLicense: "CC0-1.0",
		SPDXID:      "SPDXRef-DOCUMENT",
		Name:        fmt.Sprintf("%s %s linux/%s", binary, o.version, arch),
		// Unique per image, and the same for the same image.
		DocumentNamespace: o.source + "/spdx/" + binary + "/" + digest.String(),
		CreationInfo:      spdxCreationInfo{Created: created.Format(time.RFC3339), Creators: []string{"Tool: imagepipe-imagebuild"}},
		Packages:          []spdxPackage{main, goPkg},
		Relationships: []spdxRelationship{
			{"SPDXRef-DOCUMENT", "DESCRIBES", main.SPDXID},
			{main.SPDXID, "DEPENDS_ON", goPkg.SPDXID},
		},
	}
	for i, d := range bi.Deps {
		if d.Replace != nil {
			d = d.Replace
		}
		p := pkg(fmt.Sprintf("SPDXRef-Package-module-%d", i+1), d.Path, d.Version, "NOASSERTION")
		p.ExternalRefs = purl(d.Path, d.Version)
		doc.Packages = append(doc.Packages, p)
		doc.Relationships = append(doc.Relationships, spdxRelationship{main.SPDXID, "DEPENDS_ON", p.SPDXID})
	}
	return json.MarshalIndent(doc, "", "  ")
}

// sbomArtifact is the SBOM of img as an OCI artifact whose subject is img:
// an image manifest with artifactType application/spdx+json, the empty
// config, and the document as its one blob.
func sbomArtifact(img v1.Image, binary, arch, path string, o options, created time.Time) (v1.Image, error) {
	doc, err := sbom(img, binary, arch, path, o, created)
	if err != nil {
		return nil, err
	}
	subject, err := partial.Descriptor(img)
	if err != nil {
		return nil, err
	}
	subject = &v1.Descriptor{MediaType: subject.MediaType, Digest: subject.Digest, Size: subject.Size}
	layer := static.NewLayer(doc, spdxMediaType)
	ld, err := partial.Descriptor(layer)
	if err != nil {
		return nil, err
	}
	ld.Annotations = map[string]string{"org.opencontainers.image.title": binary + ".spdx.json"}
	emptyConfig := []byte("{}")
	ch, size, err := v1.SHA256(bytes.NewReader(emptyConfig))
	if err != nil {
		return nil, err
	}
	m := v1.Manifest{
		SchemaVersion: 2,
		MediaType:     types.OCIManifestSchema1,
		ArtifactType:  spdxMediaType,
		Config:        v1.Descriptor{MediaType: emptyMediaType, Digest: ch, Size: size, Data: emptyConfig},
		Layers:        []v1.Descriptor{*ld},
		Subject:       subject,
		Annotations:   map[string]string{"org.opencontainers.image.created": created.Format(time.RFC3339)},
	}
	raw, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	return partial.CompressedToImage(artifact{manifest: raw, config: emptyConfig, layer: layer})
}

// artifact is an OCI artifact manifest with its config and one blob, as
// go-containerregistry's remote.Write takes an image.
type artifact struct {
	manifest, config []byte
	layer            v1.Layer
}

var _ partial.CompressedImageCore = artifact{}

func (a artifact) RawConfigFile() ([]byte, error)      { return a.config, nil }
func (a artifact) MediaType() (types.MediaType, error) { return types.OCIManifestSchema1, nil }
func (a artifact) RawManifest() ([]byte, error)        { return a.manifest, nil }
func (a artifact) LayerByDigest(h v1.Hash) (partial.CompressedLayer, error) {
	if d, err := a.layer.Digest(); err == nil && d == h {
		return a.layer, nil
	}
	return nil, fmt.Errorf("the artifact has no blob %s", h)
}
