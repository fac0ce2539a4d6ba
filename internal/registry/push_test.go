package registry

import (
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/imagepipe/imagepipe/internal/disktest"
)

func TestPushIndexImageAndManifest(t *testing.T) {
	host := disktest.Registry(t)
	c := testClient(t)
	idx, err := random.Index(512, 2, 2)
	if err != nil {
		t.Fatal(err)
	}
	want, err := idx.Digest()
	if err != nil {
		t.Fatal(err)
	}
	tag, err := name.NewTag(host + "/provider/app:v1")
	if err != nil {
		t.Fatal(err)
	}
	for range 2 { // a second push of the same index is a no-op that still succeeds
		pinned, err := c.Push(t.Context(), tag, idx)
		if err != nil {
			t.Fatalf("Push of an index: %v", err)
		}
		if pinned.String() != host+"/provider/app@"+want.String() {
			t.Errorf("Push returned %s, want the repository at %s", pinned, want)
		}
	}
	got, err := remote.Index(tag)
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := got.Digest(); d != want {
		t.Errorf("the registry serves %s at %s, want %s", d, tag, want)
	}
	im, err := got.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range im.Manifests { // every image was pushed with the index
		if _, err := remote.Image(tag.Context().Digest(m.Digest.String())); err != nil {
			t.Errorf("image %s of the index: %v", m.Digest, err)
		}
	}

	// A digest reference that is not the index's own is refused before any request.
	other := tag.Context().Digest("sha256:" + strings.Repeat("0", 64))
	if _, err := c.Push(t.Context(), other, idx); err == nil || !strings.Contains(err.Error(), want.String()) {
		t.Errorf("Push to a foreign digest: %v; want an error naming %s", err, want)
	}

	// An image with a subject becomes one of the subject's referrers.
	img, err := random.Image(256, 1)
	if err != nil {
		t.Fatal(err)
	}
	subject := v1.Descriptor{MediaType: im.MediaType, Digest: want, Size: mustSize(t, idx)}
	art := mutate.Subject(img, subject).(v1.Image)
	artDigest, err := art.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Push(t.Context(), tag.Context().Digest(artDigest.String()), art); err != nil {
		t.Fatalf("Push of an image: %v", err)
	}
	refs, err := remote.Referrers(tag.Context().Digest(want.String()))
	if err != nil {
		t.Fatal(err)
	}
	rm, err := refs.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(rm.Manifests) != 1 || rm.Manifests[0].Digest != artDigest {
		t.Errorf("referrers of the index: %+v, want only %s", rm.Manifests, artDigest)
	}

	// Manifest bytes are put as they are, at a tag or at their own digest.
	raw, err := c.FetchManifest(t.Context(), tag)
	if err != nil {
		t.Fatal(err)
	}
	copied := tag.Context().Tag("copy")
	if pinned, err := c.Push(t.Context(), copied, raw); err != nil || pinned.DigestStr() != want.String() {
		t.Errorf("Push of the raw index: %v, %v; want %s", pinned, err, want)
	}
	if d, err := remote.Head(copied); err != nil || d.Digest != want || d.MediaType != raw.MediaType {
		t.Errorf("the registry serves %+v, %v at %s; want %s", d, err, copied, want)
	}
	if _, err := c.Push(t.Context(), other, RawManifest{MediaType: raw.MediaType, Bytes: raw.Bytes}); err == nil || !strings.Contains(err.Error(), want.String()) {
		t.Errorf("Push of raw bytes to a foreign digest: %v; want an error naming %s", err, want)
	}
}

func mustSize(t *testing.T, idx v1.ImageIndex) int64 {
	t.Helper()
	n, err := idx.Size()
	if err != nil {
		t.Fatal(err)
	}
	return n
}
