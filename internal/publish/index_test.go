package publish

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/imagepipe/imagepipe/internal/containerdisk"
	"github.com/imagepipe/imagepipe/internal/disktest"
	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/internal/reject"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// platformDisk is a test disk whose source digest is its own, so that
// the build record never mistakes one for another.
func platformDisk(t *testing.T, seed uint64) disktest.Source {
	t.Helper()
	src := disktest.Disk(t, 4<<20, seed)
	src.Digest = fmt.Sprintf("sha256:%064x", seed)
	return src
}

// importFor imports src for platform p to ref, appending to its index
// when appendIt.
func importFor(t *testing.T, c testEnv, ref string, src disktest.Source, p string, appendIt bool) *api.ImportResult {
	t.Helper()
	pl, err := registry.ParsePlatform(p)
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Import(t.Context(), disktest.MustTag(t, ref), src.ContainerDisk(t, containerdisk.Options{}), src,
		ImportOptions{OS: pl.OS, Architecture: pl.Architecture, Variant: pl.Variant, Append: appendIt})
	if err != nil {
		t.Fatalf("importing %s for %s: %v", ref, p, err)
	}
	return res
}

// indexAt fetches the index at ref and returns its manifest.
func indexAt(t *testing.T, ref string) (string, *v1.IndexManifest) {
	t.Helper()
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	desc, err := remote.Get(r)
	if err != nil {
		t.Fatal(err)
	}
	if desc.MediaType != types.OCIImageIndex {
		t.Fatalf("%s is a %s, not an OCI index", ref, desc.MediaType)
	}
	im, err := v1.ParseIndexManifest(bytes.NewReader(desc.Manifest))
	if err != nil {
		t.Fatal(err)
	}
	return desc.Digest.String(), im
}

// entries are an index's entries as "platform=digest".
func entries(im *v1.IndexManifest) []string {
	var out []string
	for _, m := range im.Manifests {
		out = append(out, platformString(m.Platform)+"="+m.Digest.String())
	}
	return out
}

// idxEntry is one entry of a hand-made index: the image at src, listed
// under platform with annotations.
type idxEntry struct {
	src         string
	platform    *v1.Platform
	annotations map[string]string
	nested      bool // an empty index instead of an image
}

// pushIndex pushes an OCI index of entries to ref, with annotations, with
// go-containerregistry.
func pushIndex(t *testing.T, ref string, annotations map[string]string, es ...idxEntry) string {
	t.Helper()
	var idx v1.ImageIndex = mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, e := range es {
		var img v1.Image = mutate.MediaType(empty.Image, types.OCIManifestSchema1)
		if e.src != "" {
			r, err := name.ParseReference(e.src)
			if err != nil {
				t.Fatal(err)
			}
			if img, err = remote.Image(r); err != nil {
				t.Fatal(err)
			}
		}
		var add mutate.Appendable = img
		if e.nested {
			add = mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: add, Descriptor: v1.Descriptor{Platform: e.platform, Annotations: e.annotations}})
	}
	if annotations != nil {
		idx = mutate.Annotations(idx, annotations).(v1.ImageIndex)
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(r, idx); err != nil {
		t.Fatal(err)
	}
	d, err := idx.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

func linux(arch string) *v1.Platform { return &v1.Platform{OS: "linux", Architecture: arch} }

func TestAppendPublishesOneTagForSeveralPlatforms(t *testing.T) {
	host := disktest.Registry(t)
	c := testClient(t)
	amd, arm := platformDisk(t, 1), platformDisk(t, 2)
	ref := host + "/acme/multi:1"

	first := importFor(t, c, ref, amd, "linux/amd64", true)
	d, im := indexAt(t, ref)
	if first.Digest != d || first.ImageDigest == "" || first.Pinned != host+"/acme/multi@"+d ||
		!slices.Equal(first.Platforms, []string{"linux/amd64"}) || first.Platform != "linux/amd64" ||
		!slices.Equal(entries(im), []string{"linux/amd64=" + first.ImageDigest}) {
		t.Fatalf("first append: %+v, index %s %v", first, d, entries(im))
	}
	second := importFor(t, c, ref, arm, "linux/arm64", true)
	d, im = indexAt(t, ref)
	if second.Digest != d || !slices.Equal(second.Platforms, []string{"linux/amd64", "linux/arm64"}) ||
		!slices.Equal(entries(im), []string{"linux/amd64=" + first.ImageDigest, "linux/arm64=" + second.ImageDigest}) {
		t.Fatalf("second append: %+v, index %v", second, entries(im))
	}
	// Each entry's config names the entry's platform.
	for _, m := range im.Manifests {
		img, err := remote.Image(disktest.MustTag(t, ref).Context().Digest(m.Digest.String()))
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cfg.OS != m.Platform.OS || cfg.Architecture != m.Platform.Architecture {
			t.Errorf("entry %s for %s has config %s/%s", m.Digest, platformString(m.Platform), cfg.OS, cfg.Architecture)
		}
	}

	// Resolved per platform; linux/amd64 by default.
	tag := disktest.MustTag(t, ref)
	for _, tc := range []struct {
		client testEnv
		image  string
	}{{c, first.ImageDigest}, {testClient(t, registry.WithPlatform(registry.Platform{OS: "linux", Architecture: "arm64", Variant: ""})), second.ImageDigest}, {testClient(t, registry.WithArchitecture("arm64")), second.ImageDigest}} {
		img, index, err := tc.client.PlatformImage(t.Context(), tag)
		if err != nil {
			t.Fatal(err)
		}
		if got := imageDigest(t, img); got != tc.image || index == nil || index.Digest != d || !slices.Equal(index.Platforms, []string{"linux/amd64", "linux/arm64"}) {
			t.Errorf("resolved %s in %+v; want %s from index %s", got, index, tc.image, d)
		}
	}

	// The same images added in the other order, by another machine, give
	// the same index.
	other := testClient(t)
	importFor(t, other, host+"/acme/other:1", arm, "linux/arm64", true)
	again := importFor(t, other, host+"/acme/other:1", amd, "linux/amd64", true)
	if again.Digest != d {
		t.Errorf("the index built in the other order is %s, want %s", again.Digest, d)
	}

	// An identical re-import only writes the index, which is unchanged.
	re := importFor(t, c, ref, arm, "linux/arm64", true)
	if !re.Reused || re.UploadedBytes != 0 || re.Digest != d || re.ImageDigest != second.ImageDigest {
		t.Errorf("identical re-import: %+v", re)
	}
	// ... also into another repository, where the image is mounted by
	// digest and the tag is new.
	mounted := importFor(t, c, host+"/acme/mounted:1", arm, "linux/arm64", true)
	if !mounted.Reused || mounted.UploadedBytes != 0 || mounted.ImageDigest != second.ImageDigest || !slices.Equal(mounted.Platforms, []string{"linux/arm64"}) {
		t.Errorf("re-import into another repository: %+v", mounted)
	}
}

func TestAppendReplacesItsPlatformAndKeepsTheRest(t *testing.T) {
	host := disktest.Registry(t)
	c := testClient(t)
	ref := host + "/acme/mixed:1"

	// An image the tag holds becomes its platform's entry.
	plain := importFor(t, c, ref, platformDisk(t, 1), "linux/amd64", false)
	arm := importFor(t, c, ref, platformDisk(t, 2), "linux/arm64", true)
	_, im := indexAt(t, ref)
	if !slices.Equal(entries(im), []string{"linux/amd64=" + plain.Digest, "linux/arm64=" + arm.ImageDigest}) {
		t.Fatalf("index after appending to an image: %v", entries(im))
	}
	// A new amd64 image replaces the old one.
	amd := importFor(t, c, ref, platformDisk(t, 3), "linux/amd64", true)
	_, im = indexAt(t, ref)
	if !slices.Equal(entries(im), []string{"linux/amd64=" + amd.ImageDigest, "linux/arm64=" + arm.ImageDigest}) {
		t.Fatalf("index after replacing amd64: %v", entries(im))
	}

	// An ambiguous index (two arm64 images, one with a buildx attestation)
	// is healed: one arm64 image, the attestation of the one dropped goes
	// with it, the index's annotations and other entries stay.
	ambiguous := host + "/acme/ambiguous:1"
	pushIndex(t, ambiguous, map[string]string{"org.opencontainers.image.title": "fedora"},
		idxEntry{src: plain.Pinned, platform: linux("arm64")},
		idxEntry{src: imageRef(t, amd), platform: &v1.Platform{OS: "linux", Architecture: "arm64", Variant: "v8"}},
		idxEntry{platform: &v1.Platform{OS: "unknown", Architecture: "unknown"}, annotations: map[string]string{"vnd.docker.reference.digest": plain.Digest}},
		idxEntry{src: imageRef(t, arm), platform: linux("s390x")},
	)
	healed := importFor(t, c, ambiguous, platformDisk(t, 2), "linux/arm64", true)
	d, im := indexAt(t, ambiguous)
	if !slices.Equal(entries(im), []string{"linux/arm64=" + arm.ImageDigest, "linux/s390x=" + arm.ImageDigest}) ||
		im.Annotations["org.opencontainers.image.title"] != "fedora" || healed.Digest != d {
		t.Errorf("healed index: %v %v", entries(im), im.Annotations)
	}

	// An entry without a platform stays, last.
	withUnknown := host + "/acme/unknown:1"
	pushIndex(t, withUnknown, nil, idxEntry{platform: &v1.Platform{OS: "unknown", Architecture: "unknown"}}, idxEntry{src: imageRef(t, arm), platform: linux("s390x")})
	importFor(t, c, withUnknown, platformDisk(t, 2), "linux/arm64", true)
	_, im = indexAt(t, withUnknown)
	if got := entries(im); len(got) != 3 || got[0] != "linux/arm64="+arm.ImageDigest || got[1] != "linux/s390x="+arm.ImageDigest || !strings.HasPrefix(got[2], "unknown/unknown=") {
		t.Errorf("index with an unknown entry: %v", got)
	}

	// Without --append, an index is replaced, and the result says so.
	replaced := importFor(t, c, ref, platformDisk(t, 4), "linux/s390x", false)
	if !slices.Equal(replaced.ReplacedIndex, []string{"linux/amd64", "linux/arm64"}) || replaced.ImageDigest != "" {
		t.Errorf("import over an index: %+v", replaced)
	}
	if again := importFor(t, c, ref, platformDisk(t, 4), "linux/s390x", false); again.ReplacedIndex != nil {
		t.Errorf("import over an image: %+v", again)
	}
}

// imageRef is the pinned reference of an import's image (not of the
// index it was added to).
func imageRef(t *testing.T, r *api.ImportResult) string {
	t.Helper()
	d := r.ImageDigest
	if d == "" {
		d = r.Digest
	}
	return disktest.MustTag(t, r.Reference).Context().Digest(d).String()
}

func TestAppendRefusesWhatCannotBeAnIndex(t *testing.T) {
	host := disktest.Registry(t)
	c := testClient(t)
	src := platformDisk(t, 1)
	tagDigest := func(ref string) string {
		t.Helper()
		d, err := remote.Head(disktest.MustTag(t, ref))
		if err != nil {
			t.Fatal(err)
		}
		return d.Digest.String()
	}
	arm := importFor(t, c, host+"/acme/parts:arm", src, "linux/arm64", false)
	for _, tc := range []struct {
		name, err string
		push      func(ref string)
	}{
		{"no platform", "names no platform", func(ref string) {
			head, tail := containerdisk.TarFraming(4096)
			tarball := slices.Concat(head, bytes.Repeat([]byte("imagepipe"), 4096/9+1)[:4096], tail)
			disktest.PushLayers(t, ref, nil, static.NewLayer(tarball, types.OCIUncompressedLayer))
		}},
		{"artifact", "artifact", func(ref string) {
			img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), "application/vnd.example.thing.v1+json")
			if err := remote.Write(disktest.MustTag(t, ref), img); err != nil {
				t.Fatal(err)
			}
		}},
		{"too many entries", "would list 65 manifests", func(ref string) {
			var es []idxEntry
			for range registry.MaxIndexEntries {
				es = append(es, idxEntry{src: arm.Pinned, platform: linux("386")})
			}
			pushIndex(t, ref, nil, es...)
		}},
		{"past the entry limit", "lists 65 manifests", func(ref string) {
			var es []idxEntry
			for range registry.MaxIndexEntries + 1 {
				es = append(es, idxEntry{src: arm.Pinned, platform: linux("386")})
			}
			pushIndex(t, ref, nil, es...)
		}},
		{"past the size limit", "imagepipe reads indexes of at most", func(ref string) {
			pushIndex(t, ref, map[string]string{"padding": strings.Repeat("x", registry.MaxIndexSize)}, idxEntry{src: arm.Pinned, platform: linux("arm64")})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ref := host + "/acme/refused:" + strings.ReplaceAll(tc.name, " ", "-")
			tc.push(ref)
			before := tagDigest(ref)
			_, err := c.Import(t.Context(), disktest.MustTag(t, ref), src.ContainerDisk(t, containerdisk.Options{}), src, ImportOptions{Append: true})
			if err == nil || !strings.Contains(err.Error(), tc.err) || reject.As(err) != nil {
				t.Errorf("append: %v; want an error (not a rejection of the disk) saying %q", err, tc.err)
			}
			if after := tagDigest(ref); after != before {
				t.Errorf("the tag moved from %s to %s", before, after)
			}
		})
	}
	if _, err := c.Import(t.Context(), disktest.MustTag(t, host+"/acme/refused:windows"), src.ContainerDisk(t, containerdisk.Options{}), src, ImportOptions{OS: "windows"}); err == nil || !strings.Contains(err.Error(), "must be linux") {
		t.Errorf("import for windows: %v", err)
	}
}

// TestAppendMergesAgainWhenTheTagMoves has another publisher write the tag
// at the worst moments: between the read of the index and its write, and
// right after the write (dropping this import's entry). Both times the
// index is merged again, and ends up holding both publishers' images.
func TestAppendMergesAgainWhenTheTagMoves(t *testing.T) {
	host := disktest.Registry(t)
	setup := testClient(t)
	amd := importFor(t, setup, host+"/acme/race:1", platformDisk(t, 1), "linux/amd64", true)
	other := importFor(t, setup, host+"/acme/race:other", platformDisk(t, 9), "linux/s390x", false)

	for _, tc := range []struct {
		name, method string
		intruder     []idxEntry // what the other publisher writes
		want         []string   // the platforms at the end
	}{
		{"before the write", "GET", []idxEntry{{src: imageRef(t, amd), platform: linux("amd64")}, {src: other.Pinned, platform: linux("s390x")}},
			[]string{"linux/amd64", "linux/arm64", "linux/s390x"}},
		{"after the write", "PUT", []idxEntry{{src: other.Pinned, platform: linux("ppc64le")}},
			[]string{"linux/arm64", "linux/ppc64le"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var armed, fired atomic.Bool
			c := testClient(t, registry.WithRequestObserver(func(method, path string, status int) {
				if armed.Load() && method == tc.method && path == "/v2/acme/race/manifests/1" && status < 300 && !fired.Swap(true) {
					pushIndex(t, host+"/acme/race:1", nil, tc.intruder...)
				}
			}))
			armed.Store(true)
			res := importFor(t, c, host+"/acme/race:1", platformDisk(t, 2), "linux/arm64", true)
			d, im := indexAt(t, host+"/acme/race:1")
			var got []string
			for _, m := range im.Manifests {
				got = append(got, platformString(m.Platform))
			}
			if !fired.Load() || res.Digest != d || !slices.Equal(got, tc.want) || !slices.Equal(res.Platforms, tc.want) {
				t.Errorf("fired %v; index %s holds %v, result %+v; want %v", fired.Load(), d, got, res, tc.want)
			}
		})
	}
}

func TestResolveRefusesHostileIndexes(t *testing.T) {
	host := disktest.Registry(t)
	c := testClient(t)
	amd := importFor(t, c, host+"/acme/parts:amd", platformDisk(t, 1), "linux/amd64", false)
	arm := importFor(t, c, host+"/acme/parts:arm", platformDisk(t, 2), "linux/arm64", false)
	armOnly := testClient(t, registry.WithPlatform(registry.Platform{OS: "linux", Architecture: "arm64", Variant: ""}))
	var many []idxEntry
	for range registry.MaxIndexEntries + 1 {
		many = append(many, idxEntry{src: arm.Pinned, platform: linux("386")})
	}
	for _, tc := range []struct {
		name        string
		annotations map[string]string
		entries     []idxEntry
		client      testEnv
		reason      string // part of the rejection
		describes   string // the image the report still describes, if any
		copyRefused bool   // a whole copy is refused too
	}{
		{name: "entry lies about its platform", entries: []idxEntry{{src: amd.Pinned, platform: linux("arm64")}}, client: armOnly,
			reason: "as linux/arm64, but its config says linux/amd64", describes: amd.Digest},
		{name: "no image for the default platform", entries: []idxEntry{{src: arm.Pinned, platform: linux("arm64")}}, client: c,
			reason: "holds no linux/amd64 image (it holds: linux/arm64)"},
		{name: "two images for one platform", entries: []idxEntry{{src: arm.Pinned, platform: linux("arm64")}, {src: amd.Pinned, platform: &v1.Platform{OS: "linux", Architecture: "arm64", Variant: "v8"}}}, client: armOnly,
			reason: "holds 2 linux/arm64 images; it must hold one"},
		{name: "nested index", entries: []idxEntry{{nested: true, platform: linux("arm64")}, {src: amd.Pinned, platform: linux("amd64")}}, client: armOnly,
			reason: "linux/arm64 entry sha256:"},
		{name: "too many entries", entries: many, client: c, reason: "lists 65 manifests", copyRefused: true},
		{name: "too large", annotations: map[string]string{"padding": strings.Repeat("x", registry.MaxIndexSize)}, entries: []idxEntry{{src: amd.Pinned, platform: linux("amd64")}}, client: c,
			reason: "imagepipe reads indexes of at most", copyRefused: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ref := disktest.MustTag(t, host+"/acme/hostile:"+strings.ReplaceAll(tc.name, " ", "-"))
			pushIndex(t, ref.String(), tc.annotations, tc.entries...)
			img, index, err := tc.client.PlatformImage(t.Context(), ref)
			if re := reject.As(err); re == nil || re.Reason != reject.PlatformMismatch || !strings.Contains(err.Error(), tc.reason) ||
				index == nil || imageDigest(t, img) != tc.describes {
				t.Errorf("resolve: %v, %+v, image %s; want a platform-mismatch saying %q with the image %q", err, index, imageDigest(t, img), tc.reason, tc.describes)
			}
			p := &registry.DefaultPlatform
			if tc.client.Client == armOnly.Client {
				p = &registry.Platform{OS: "linux", Architecture: "arm64"}
			}
			dst := disktest.MustTag(t, host+"/acme/copied:"+strings.ReplaceAll(tc.name, " ", "-"))
			if _, err := c.Copy(t.Context(), ref, dst, registry.CopyOptions{Platform: p}); reject.As(err) == nil || !strings.Contains(err.Error(), tc.reason) {
				t.Errorf("copy --platform %s: %v", p, err)
			}
			_, err = c.Copy(t.Context(), ref, dst, registry.CopyOptions{})
			if tc.copyRefused != (err != nil) || (err != nil && !strings.Contains(err.Error(), tc.reason)) {
				t.Errorf("copy of the whole index: %v", err)
			}
		})
	}

	// An image outside an index: taken as it is, unless a platform was
	// asked for; then it must be built for it, and the report describes it.
	if img, index, err := c.PlatformImage(t.Context(), disktest.MustTag(t, host+"/acme/parts:amd")); err != nil || index != nil || imageDigest(t, img) != amd.Digest {
		t.Errorf("resolving an image: %s, %+v, %v", imageDigest(t, img), index, err)
	}
	img, _, err := armOnly.PlatformImage(t.Context(), disktest.MustTag(t, host+"/acme/parts:amd"))
	if reject.As(err) == nil || imageDigest(t, img) != amd.Digest || !strings.Contains(err.Error(), "built for linux/amd64; linux/arm64 was asked for") {
		t.Errorf("resolving an amd64 image for arm64: %s, %v", imageDigest(t, img), err)
	}
	if _, err := c.Copy(t.Context(), disktest.MustTag(t, host+"/acme/parts:amd"), disktest.MustTag(t, host+"/acme/copied:x"), registry.CopyOptions{Platform: &registry.Platform{OS: "linux", Architecture: "arm64", Variant: ""}}); reject.As(err) == nil {
		t.Errorf("copy --platform linux/arm64 of an amd64 image: %v", err)
	}

	// Copying one platform of a good index gives that image, its digest
	// kept; the whole index keeps the index's digest.
	good := disktest.MustTag(t, host+"/acme/good:1")
	d := pushIndex(t, good.String(), nil, idxEntry{src: amd.Pinned, platform: linux("amd64")}, idxEntry{src: arm.Pinned, platform: linux("arm64")})
	pinned, err := c.Copy(t.Context(), good, disktest.MustTag(t, host+"/acme/copied:arm"), registry.CopyOptions{Platform: &registry.Platform{OS: "linux", Architecture: "arm64", Variant: ""}})
	if err != nil || pinned.DigestStr() != arm.Digest {
		t.Errorf("copy --platform linux/arm64: %v, %v; want %s", pinned, err, arm.Digest)
	}
	pinned, err = c.Copy(t.Context(), good, disktest.MustTag(t, host+"/acme/copied:all"), registry.CopyOptions{})
	if err != nil || pinned.DigestStr() != d {
		t.Errorf("copy of the index: %v, %v; want %s", pinned, err, d)
	}
}

// imageDigest is img's manifest digest, "" for no image.
func imageDigest(t *testing.T, img v1.Image) string {
	t.Helper()
	if img == nil {
		return ""
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

// platformString names an index entry's platform as reports do.
func platformString(p *v1.Platform) string {
	if p == nil || p.OS == "" || p.Architecture == "" {
		return "unknown"
	}
	return registry.Platform{OS: p.OS, Architecture: p.Architecture, Variant: p.Variant}.String()
}
