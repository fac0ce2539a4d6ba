package syncer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"

	"github.com/imagepipe/imagepipe/internal/attest"
	"github.com/imagepipe/imagepipe/internal/cdi"
	"github.com/imagepipe/imagepipe/internal/gate"
	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/internal/verdict"
	"github.com/imagepipe/imagepipe/pkg/api"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// wakeBound is how soon after the gate starts the DataVolume must appear.
// A BaseImage that has waited an hour for its verdict is looked at again
// only a minute later (the syncer's verdictRecheckMax); the verdict's
// webhook must wake it well before that.
const wakeBound = 30 * time.Second

// TestAVerdictWakesTheHubAtOnce: a digest whose verdict has not come is
// looked at again only after a backoff that grows to a minute; the gate's
// verdict, announced by the registry's webhook, must wake it at once.
// The gate is down while the image is pushed, and the BaseImage's seen-at
// stamp is moved an hour back, so that its next recheck is a minute away:
// the DataVolume appearing within wakeBound of the gate's start is the
// wake. First the webhooks reach the replica that does not lead, which
// stamps the BaseImage for the leader; then, the first replica stopped,
// they reach the leader itself.
func TestAVerdictWakesTheHubAtOnce(t *testing.T) {
	t.Parallel()
	testenv.RequireQEMU(t)
	hub := startAPIHub(t, "hub-a")
	first, second := harness.ReserveSyncer(t), harness.ReserveSyncer(t)
	gate := harness.ReserveGate(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{NotifyURL: second.WebhookURL, NotifyURLs: []string{gate.WebhookURL}, NotifyToken: webhookToken})
	startSyncer(t, first, hub, reg.Host, "--poll-interval", "1h")
	waitFor(t, "the first replica leads", func() (bool, error) {
		return first.Metric(t, "leader_election_master_status") == 1, nil
	})
	startSyncer(t, second, hub, reg.Host, "--poll-interval", "1h")

	// awaitingVerdict pushes an image while no gate runs and waits until
	// its BaseImage waits for the verdict, an hour old, with its next look
	// a minute away. The leader looks twice after the stamp is moved: once
	// for the stamp, once for the short recheck its first look had
	// scheduled (the syncer keeps the earliest); the second look then
	// schedules the next a minute on.
	awaitingVerdict := func(tag string) string {
		t.Helper()
		res := importImage(t, rawDisk(t, "wake "+tag), reg.Host+"/acme/rhel:"+tag)
		name := "rhel--" + tag
		bi := hub.baseImage(t, "acme", name, "awaiting the verdict", func(b *v1alpha1.BaseImage) bool {
			c := apimeta.FindStatusCondition(b.Status.Conditions, v1alpha1.ConditionProgressing)
			return c != nil && c.Reason == "AwaitingVerdict"
		})
		// A look for the verdict is the syncer's GET of the digest's
		// referrers tag (distribution has no referrers API), in the
		// registry's access log.
		referrersTag := "/manifests/" + strings.Replace(res.Digest, ":", "-", 1) + " "
		looks := func() (int, error) {
			data, err := os.ReadFile(reg.LogPath())
			n := 0
			for line := range strings.Lines(string(data)) {
				if strings.Contains(line, `"GET /v2/acme/rhel`+referrersTag) && strings.Contains(line, `"image-syncer/`) {
					n++
				}
			}
			return n, err
		}
		before, err := looks()
		if err != nil {
			t.Fatal(err)
		}
		patch := client.MergeFrom(bi.DeepCopy())
		bi.Annotations[v1alpha1.AnnotationSeenAt] = time.Now().Add(-time.Hour).Format(time.RFC3339Nano)
		if err := hub.Client.Patch(t.Context(), bi, patch); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "two looks for the verdict after the stamp moved", func() (bool, error) {
			n, err := looks()
			return n >= before+2, err
		})
		return res.Digest
	}
	importsWithin := func(digest string) {
		t.Helper()
		harness.WaitUntil(t, fmt.Sprintf("the DataVolume of %s within %s of the gate's start", digest, wakeBound), wakeBound, 50*time.Millisecond, func() (bool, error) {
			var dv cdiv1.DataVolume
			err := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: "acme", Name: dvName(digest)}, &dv)
			return err == nil, client.IgnoreNotFound(err)
		})
	}
	attachedAt := func(tag string) string {
		var bi v1alpha1.BaseImage
		if err := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: "acme", Name: "rhel--" + tag}, &bi); err != nil {
			t.Fatal(err)
		}
		return bi.Annotations[v1alpha1.AnnotationAttachedAt]
	}

	d1 := awaitingVerdict("1")
	gate.Start(t, testenv.ImageGate, reg.Host, "", "", "")
	importsWithin(d1)
	if attachedAt("1") == "" {
		t.Errorf("the replica that does not lead left no %s stamp for the leader", v1alpha1.AnnotationAttachedAt)
	}

	gate.Stop(t)
	first.Stop(t)
	waitFor(t, "the second replica leads", func() (bool, error) {
		return second.Metric(t, "leader_election_master_status") == 1, nil
	})
	d2 := awaitingVerdict("2")
	harness.ReserveGate(t).Start(t, testenv.ImageGate, reg.Host, "", "", "")
	importsWithin(d2)
	if at := attachedAt("2"); at != "" {
		t.Errorf("the leader stamped the BaseImage (%s=%s) instead of queueing it", v1alpha1.AnnotationAttachedAt, at)
	}
}

// TestAVerdictNotYetListedWakesTheHub: distribution announces a pushed
// manifest before its referrers tag lists it, and under load the tag moves
// up to a second later. The verdict's own push event names its digest, so
// the syncer must read the verdict by that digest and import at once,
// whatever the registry lists. The test plays the gate's publishing step
// alone: the gate's own Verifier gives the verdict in this process, it is
// signed with the provider key, and its manifest is PUT by digest with
// plain HTTP, so that the referrers tag never lists it.
func TestAVerdictNotYetListedWakesTheHub(t *testing.T) {
	t.Parallel()
	hub := startAPIHub(t, "hub-a")
	s := harness.ReserveSyncer(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{NotifyURL: s.WebhookURL, NotifyToken: webhookToken})
	startSyncer(t, s, hub, reg.Host, "--poll-interval", "1h")

	res := importImage(t, rawDisk(t, "a verdict not yet listed"), reg.Host+"/acme/rhel:1")
	hub.baseImage(t, "acme", "rhel--1", "awaiting the verdict", func(b *v1alpha1.BaseImage) bool {
		c := apimeta.FindStatusCondition(b.Status.Conditions, v1alpha1.ConditionProgressing)
		return c != nil && c.Reason == "AwaitingVerdict"
	})

	subject, err := name.NewDigest(reg.Host+"/acme/rhel@"+res.Digest, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := registry.New(registry.WithCacheDir(""), registry.WithInsecure(true))
	if err != nil {
		t.Fatal(err)
	}
	v, err := (&gate.Verifier{Registry: rc, TempDir: t.TempDir(), Engine: "image-gate", Version: "test"}).Verify(t.Context(), subject)
	if err != nil || v.Verdict != api.VerdictAccepted {
		t.Fatalf("the gate's verifier: %+v, %v", v, err)
	}
	referrer := putUnlistedVerdict(t, subject, v)

	referrersTag := reg.Host + "/acme/rhel:" + strings.Replace(res.Digest, ":", "-", 1)
	harness.WaitUntil(t, fmt.Sprintf("the DataVolume of %s within %s of its verdict's push", res.Digest, wakeBound), wakeBound, 50*time.Millisecond, func() (bool, error) {
		var dv cdiv1.DataVolume
		err := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: "acme", Name: dvName(res.Digest)}, &dv)
		return err == nil, client.IgnoreNotFound(err)
	})
	tag, err := name.NewTag(referrersTag, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := remote.Head(tag); err == nil {
		t.Fatalf("the referrers tag %s exists; the test meant the registry to list no verdict (%s)", referrersTag, referrer)
	}

	// The gate is quicker than the hub: the verdict comes before the tag's
	// BaseImage exists. The image is pushed by digest only, its verdict
	// put and fetched by the syncer, and only then tagged.
	img, err := remote.Image(subject)
	if err != nil {
		t.Fatal(err)
	}
	early, err := name.NewDigest(reg.Host+"/acme/debian@"+res.Digest, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(early, img); err != nil {
		t.Fatal(err)
	}
	v, err = (&gate.Verifier{Registry: rc, TempDir: t.TempDir(), Engine: "image-gate", Version: "test"}).Verify(t.Context(), early)
	if err != nil || v.Verdict != api.VerdictAccepted {
		t.Fatalf("the gate's verifier on %s: %+v, %v", early, v, err)
	}
	referrer = putUnlistedVerdict(t, early, v)
	waitFor(t, "the syncer reading the verdict "+referrer, func() (bool, error) {
		data, err := os.ReadFile(reg.LogPath())
		return strings.Contains(string(data), `"GET /v2/acme/debian/manifests/`+referrer+` HTTP/1.1" 200`), err
	})
	debianTag, err := name.NewTag(reg.Host+"/acme/debian:12", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Tag(debianTag, img); err != nil {
		t.Fatal(err)
	}
	harness.WaitUntil(t, fmt.Sprintf("the DataVolume of acme/debian:12 within %s of its tag", wakeBound), wakeBound, 50*time.Millisecond, func() (bool, error) {
		var dv cdiv1.DataVolume
		err := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: "acme", Name: cdi.DataVolumeName("debian", res.Digest)}, &dv)
		return err == nil, client.IgnoreNotFound(err)
	})
}

// putUnlistedVerdict signs v with the provider key and pushes it as a
// referrer of subject, as verdict.Publish does, but PUTs the manifest by
// digest with plain HTTP: no referrers tag lists it. It returns the
// manifest's digest.
func putUnlistedVerdict(t *testing.T, subject name.Digest, v *api.Verdict) string {
	t.Helper()
	keyFile, _ := harness.ProviderKeyFiles(t)
	pemKey, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := attest.LoadSigner(pemKey, nil)
	if err != nil {
		t.Fatal(err)
	}
	pred, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	bundle, err := signer.Sign(t.Context(), attest.Statement{Subject: subject.DigestStr(), SubjectName: subject.Context().Name(),
		PredicateType: api.VerdictPredicateType, Predicate: pred})
	if err != nil {
		t.Fatal(err)
	}
	subjectDesc, err := remote.Head(subject)
	if err != nil {
		t.Fatal(err)
	}
	for _, blob := range [][]byte{[]byte("{}"), bundle} {
		if err := remote.WriteLayer(subject.Context(), static.NewLayer(blob, types.OCILayer)); err != nil {
			t.Fatal(err)
		}
	}
	m, err := json.Marshal(ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest,
		ArtifactType: api.VerdictArtifactType, Config: ocispec.DescriptorEmptyJSON,
		Layers:      []ocispec.Descriptor{{MediaType: attest.BundleMediaType, Digest: digest.FromBytes(bundle), Size: int64(len(bundle))}},
		Subject:     &ocispec.Descriptor{MediaType: string(subjectDesc.MediaType), Digest: digest.Digest(subjectDesc.Digest.String()), Size: subjectDesc.Size},
		Annotations: map[string]string{verdict.PredicateTypeAnnotation: api.VerdictPredicateType},
	})
	if err != nil {
		t.Fatal(err)
	}
	d := digest.FromBytes(m).String()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPut, "http://"+subject.RegistryStr()+"/v2/"+subject.RepositoryStr()+"/manifests/"+d, bytes.NewReader(m))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", ocispec.MediaTypeImageManifest)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("PUT of the verdict's manifest: %s", resp.Status)
	}
	return d
}
