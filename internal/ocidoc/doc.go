// Package ocidoc reads the manifest, index and config of a pushed image
// strictly, so that what it accepts has one reading in every client: the
// gate (internal/gate) reads pushed documents only through it.
//
// ParseDocument takes the registry's Content-Type and the body. It refuses
// a Content-Type the body's mediaType contradicts (CDI's importer goes by
// the former, most clients by the latter), a JSON key twice or in two
// cases in one object (decoders disagree on which counts), more than one
// JSON value, a descriptor with urls or embedded data (a reader would
// fetch those instead of the blob), an index with a config or layers, an
// image manifest without a config or with manifests, an artifact, and
// more than 64 annotations.
//
// ParseConfig accepts a linux config with one diff ID, at most 256 labels,
// and no environment but KubeVirt's instancetype defaults, each a valid
// object name. Both return *reject.Error (reject.ManifestShape) for what
// they refuse; neither reads more than the bytes it is given, which the
// caller bounds (MaxConfigSize for a config).
package ocidoc
