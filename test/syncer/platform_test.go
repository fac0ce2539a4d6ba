package syncer

import (
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"k8s.io/apimachinery/pkg/api/meta"

	"github.com/imagepipe/imagepipe/internal/cdi"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// pushIndex pushes to ref an image index of the images at refs, each under
// the linux platform of its architecture, with go-containerregistry.
func pushIndex(t *testing.T, ref string, images map[string]string) {
	t.Helper()
	var entries [][2]string
	for arch, src := range images {
		entries = append(entries, [2]string{arch, src})
	}
	pushIndexOf(t, ref, entries)
}

// pushIndexOf pushes an index of (architecture, image reference) entries,
// in order.
func pushIndexOf(t *testing.T, ref string, entries [][2]string) {
	t.Helper()
	var idx v1.ImageIndex = empty.Index
	for _, e := range entries {
		arch, src := e[0], e[1]
		r, err := name.ParseReference(src, name.Insecure)
		if err != nil {
			t.Fatal(err)
		}
		img, err := remote.Image(r)
		if err != nil {
			t.Fatal(err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arch}}})
	}
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(r, idx); err != nil {
		t.Fatal(err)
	}
}

// TestSyncerImportsOnlyItsArchitecture runs a syncer on a hub without
// nodes, so amd64: an arm64-only image is refused with a condition naming
// the platform; of an index holding amd64 and arm64 images, the gate's
// canonical amd64 image is imported (the DataVolume names that image, so
// CDI has no index to pick from); an index without amd64 is refused, and
// so is one listing amd64 twice, which readers could resolve two ways.
func TestSyncerImportsOnlyItsArchitecture(t *testing.T) {
	t.Parallel()
	hub := startTestHub(t, "hub-a")
	s := harness.ReserveSyncer(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{Gate: testenv.ImageGate, NotifyURL: s.WebhookURL, NotifyToken: webhookToken})
	startSyncer(t, s, hub, reg.Host, "--poll-interval", "1h")

	rejected := func(name, reason, want string) {
		t.Helper()
		bi := hub.baseImage(t, "acme", name, "rejected", func(b *v1alpha1.BaseImage) bool { return b.Status.Phase == v1alpha1.PhaseRejected })
		c := meta.FindStatusCondition(bi.Status.Conditions, v1alpha1.ConditionRejected)
		if c == nil || c.Reason != reason || !strings.Contains(c.Message, want) {
			t.Errorf("%s: Rejected condition %+v, want %s naming %q", name, c, reason, want)
		}
	}
	importImageWith(t, "", rawDisk(t, "arm"), reg.Host+"/acme/armonly:1", "--platform", "linux/arm64")
	rejected("armonly--1", "PlatformMismatch", "the image holds linux/arm64; this hub runs amd64")
	if dvs := hub.dataVolumes(t, "acme", "armonly"); len(dvs) != 0 {
		t.Errorf("an arm64 image was imported onto an amd64 hub: %v", dvs)
	}

	amd := importImageWith(t, "", rawDisk(t, "amd"), reg.Host+"/acme/parts:amd64")
	arm := importImageWith(t, "", rawDisk(t, "arm"), reg.Host+"/acme/parts:arm64", "--platform", "linux/arm64")
	pushIndex(t, reg.Host+"/acme/multi:1", map[string]string{"amd64": amd.Pinned, "arm64": arm.Pinned})
	bi := hub.baseImage(t, "acme", "multi--1", "importing", func(b *v1alpha1.BaseImage) bool { return pickedUp(b) })
	dvs := hub.dataVolumes(t, "acme", "multi")
	dv, ok := dvs[cdi.DataVolumeName("multi", bi.Status.ObservedDigest)]
	if len(dvs) != 1 || !ok {
		t.Fatalf("data volumes of the index: %v", dvs)
	}
	src := dv.Spec.Source.Registry
	if want := "docker://" + reg.Host + "/acme/multi@" + amd.Digest; *src.URL != want || src.Platform != nil || bi.Status.CanonicalDigest != amd.Digest {
		t.Errorf("DataVolume source %s platform %+v, canonical %s; want %s, the amd64 image, with no platform to pick", *src.URL, src.Platform, bi.Status.CanonicalDigest, want)
	}

	pushIndex(t, reg.Host+"/acme/armindex:1", map[string]string{"arm64": arm.Pinned})
	rejected("armindex--1", "PlatformMismatch", "the image holds linux/arm64; this hub runs amd64")

	// Two amd64 images in one index: the one checked might not be the
	// one CDI picks, so neither is imported.
	other := importImageWith(t, "", rawDisk(t, "other"), reg.Host+"/acme/parts:other")
	pushIndexOf(t, reg.Host+"/acme/twoamd:1", [][2]string{{"amd64", amd.Pinned}, {"amd64", other.Pinned}})
	rejected("twoamd--1", "ManifestShape", "the index lists linux/amd64 twice")
}
