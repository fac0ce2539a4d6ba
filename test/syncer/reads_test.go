package syncer

import (
	"bufio"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/pkg/api"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// gateLooksAgain is how long after its verdict the gate may still look
// at the subject because of a push it announced (the looks again of a
// referrers tag's push come 1 s and 5 s after it), with a margin.
const gateLooksAgain = 7 * time.Second

// TestOnePushIsReadWithoutRepeats: an image pushed to a registry without
// the referrers API, the real gate beside it and a hub's syncer waiting
// for its verdict, costs each reader no repeated read. In the registry's
// access log: the gate (parent and verification child) reads the
// subject's manifest once, and never reads back the verdict it gave, not
// even when its own push of the referrers tag is announced; the syncer
// reads the verdict's manifest at most once per look at the verdict,
// which reads the bundle too: the looks within a minute of the verdict's
// announcement read the manifest the announcement's handling fetched.
func TestOnePushIsReadWithoutRepeats(t *testing.T) {
	t.Parallel()
	testenv.RequireQEMU(t)
	hub := startAPIHub(t, "hub-a")
	s := harness.ReserveSyncer(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{Gate: testenv.ImageGate, NotifyURL: s.WebhookURL, NotifyToken: webhookToken})
	startSyncer(t, s, hub, reg.Host, "--poll-interval", "1h")
	res := importImage(t, rawDisk(t, "one read"), reg.Host+"/acme/rhel:9")
	hub.baseImage(t, "acme", "rhel--9", "admitted", func(b *v1alpha1.BaseImage) bool {
		return b.Status.ObservedDigest == res.Digest && b.Status.CanonicalDigest != ""
	})
	time.Sleep(gateLooksAgain) // absence cannot be waited for: the window it would fall in is

	rc, err := registry.New(registry.WithCacheDir(t.TempDir()), registry.WithInsecure(true))
	if err != nil {
		t.Fatal(err)
	}
	subject, err := name.NewDigest(reg.Host+"/acme/rhel@"+res.Digest, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	refs, _, err := rc.Referrers(t.Context(), subject, api.VerdictArtifactType)
	if err != nil || len(refs) != 1 {
		t.Fatalf("%d verdicts attached (%v); want one", len(refs), err)
	}
	verdictManifest := "/v2/acme/rhel/manifests/" + refs[0].Digest.String()
	raw, err := rc.FetchManifest(t.Context(), subject.Context().Digest(refs[0].Digest.String()))
	if err != nil {
		t.Fatal(err)
	}
	var artifact ocispec.Manifest
	if err := json.Unmarshal(raw.Bytes, &artifact); err != nil || len(artifact.Layers) != 1 {
		t.Fatalf("the verdict's manifest: %v, %d layers", err, len(artifact.Layers))
	}
	bundle := "/v2/acme/rhel/blobs/" + artifact.Layers[0].Digest.String()

	gets := registryGets(t, reg)
	t.Logf("the gate read the subject's manifest %d times and the verdict's bundle %d; the syncer the verdict's manifest %d times and its bundle %d",
		gets["imagepipe-gate/ /v2/acme/rhel/manifests/"+res.Digest], gets["imagepipe-gate/ "+bundle], gets["image-syncer/ "+verdictManifest], gets["image-syncer/ "+bundle])
	if n := gets["imagepipe-gate/ /v2/acme/rhel/manifests/"+res.Digest]; n != 1 {
		t.Errorf("the gate read the subject's manifest %d times; want once", n)
	}
	if n := gets["imagepipe-gate/ "+bundle]; n != 0 {
		t.Errorf("the gate read back the verdict it gave %d times; want none", n)
	}
	manifests, bundles := gets["image-syncer/ "+verdictManifest], gets["image-syncer/ "+bundle]
	if bundles == 0 || manifests > bundles {
		t.Errorf("the syncer read the verdict's manifest %d times for %d looks at its bundle; want at most once per look", manifests, bundles)
	}
}

// registryGets counts the registry's completed GETs, by the client's
// User-Agent up to its version ("image-syncer/") and the path.
func registryGets(t *testing.T, reg *harness.Registry) map[string]int {
	t.Helper()
	f, err := os.Open(reg.LogPath())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gets := map[string]int{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, `msg="response completed"`) || !strings.Contains(line, "http.request.method=GET ") {
			continue
		}
		_, uri, _ := strings.Cut(line, `http.request.uri="`)
		uri, _, _ = strings.Cut(uri, `"`)
		uri, _, _ = strings.Cut(uri, "?")
		_, ua, _ := strings.Cut(line, `http.request.useragent="`)
		ua, _, _ = strings.Cut(ua, "/")
		gets[ua+"/ "+uri]++
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return gets
}
