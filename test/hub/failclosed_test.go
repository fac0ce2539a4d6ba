package hub

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/imagepipe/imagepipe/internal/cdi"
	"github.com/imagepipe/imagepipe/internal/hub"
	"github.com/imagepipe/imagepipe/internal/intake"
	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/internal/verdict"
	"github.com/imagepipe/imagepipe/pkg/api"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
	"github.com/imagepipe/imagepipe/test/harness"
)

// gateAnswers plays the gate's verdicts in the registry, digest by
// digest, as verdict.Find would report them: an accepted or refused
// verdict, none (verdict.NoVerdictError), or a registry that cannot be
// read. A digest it was not told of has no verdict.
type gateAnswers struct {
	mu      sync.Mutex
	answers map[string]func(name.Digest) (*api.Verdict, error)
}

func (g *gateAnswers) set(digest string, answer func(name.Digest) (*api.Verdict, error)) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.answers == nil {
		g.answers = map[string]func(name.Digest) (*api.Verdict, error){}
	}
	g.answers[digest] = answer
}

func (g *gateAnswers) Verdict(_ context.Context, subject name.Digest) (*api.Verdict, error) {
	g.mu.Lock()
	answer := g.answers[subject.DigestStr()]
	g.mu.Unlock()
	if answer == nil {
		return nil, &verdict.NoVerdictError{Subject: subject.String()}
	}
	return answer(subject)
}
func (*gateAnswers) Forget(name.Digest)                        {}
func (*gateAnswers) Expect(name.Digest, *registry.RawManifest) {}

// accepted is the gate's verdict admitting a digest whose canonical image
// for linux/amd64 is canonical ("" means the digest itself).
func accepted(canonical string) func(name.Digest) (*api.Verdict, error) {
	return func(subject name.Digest) (*api.Verdict, error) {
		if canonical == "" {
			canonical = subject.DigestStr()
		}
		return &api.Verdict{
			Repository: subject.RepositoryStr(), Subject: subject.DigestStr(), Verdict: api.VerdictAccepted,
			Images: []api.VerifiedImage{{Platform: "linux/amd64", Source: subject.DigestStr(), Canonical: canonical, Format: "qcow2", VirtualSize: 512 << 20, DiskSize: 327680}},
			Engine: "imagepipe-gate", EngineVersion: "test", VerifiedAt: time.Now().UTC().Format(api.VerdictTimeFormat),
		}, nil
	}
}

// refused is the gate's verdict refusing a digest for a shared cluster.
func refused(subject name.Digest) (*api.Verdict, error) {
	return &api.Verdict{
		Repository: subject.RepositoryStr(), Subject: subject.DigestStr(), Verdict: api.VerdictRejected,
		Reasons: []api.Rejection{{Code: "shared-cluster", Message: "cluster 0x40000 is mapped 8192 times"}},
		Engine:  "imagepipe-gate", EngineVersion: "test", VerifiedAt: time.Now().UTC().Format(api.VerdictTimeFormat),
	}, nil
}

// untrusted is a verdict signed only by a key the hub no longer trusts
// (a provider removed it), as verdict.Find reports it.
func untrusted(subject name.Digest) (*api.Verdict, error) {
	return nil, &verdict.NoVerdictError{Subject: subject.String(), Refused: []string{"signed by a key no longer trusted"}}
}

func unreachable(name.Digest) (*api.Verdict, error) {
	return nil, errors.New("dial tcp 127.0.0.1:1: connect: connection refused")
}

// failClosedHub is a hub with BaseImage acme/rhel:9 at digest, left as an
// image-syncer made before the gate (or anything else writing BaseImages)
// could leave it: its status written by hand from st, and, when served,
// the DataVolume such a syncer made (importing from url, finished) and
// the DataSource pointing at its volume.
type failClosedHub struct {
	cluster *harness.SyncerHub
	r       *hub.Reconciler
	gate    *gateAnswers
	key     client.ObjectKey
	image   string
}

func newFailClosedHub(t *testing.T, digest string, st v1alpha1.BaseImageStatus, servedFrom string) *failClosedHub {
	t.Helper()
	cluster := harness.StartSyncerHub(t, "hub-a", harness.SyncerHubOptions{Namespaces: []string{"acme"}, NoCDI: true})
	reg, tenancy := applierParts(t)
	applier := &hub.Applier{Client: cluster.Client, Registry: reg, Tenancy: tenancy}
	if err := applier.Apply(t.Context(), intake.Event{Action: intake.ActionPush, Repository: "acme/rhel", Tag: "9", Digest: digest}); err != nil {
		t.Fatal(err)
	}
	h := &failClosedHub{cluster: cluster, gate: &gateAnswers{}, image: cdi.ImageName("acme/rhel"),
		key: client.ObjectKey{Namespace: "acme", Name: cdi.BaseImageName("acme/rhel", "9")}}
	h.r = &hub.Reconciler{Client: cluster.Client, Registry: reg, Verdicts: h.gate}
	var bi v1alpha1.BaseImage
	if err := cluster.Client.Get(t.Context(), h.key, &bi); err != nil {
		t.Fatal(err)
	}
	if servedFrom != "" {
		h.served(t, &bi, digest, servedFrom)
		st.ImportedDigest, st.PVCName, st.DataSourceName = digest, h.dvName(digest), bi.Name
		st.Imports = []v1alpha1.ImportRecord{{Digest: digest, DataVolume: h.dvName(digest), CompletedAt: metav1.Now()}}
	}
	bi.Status = st
	if err := cluster.Client.Status().Update(t.Context(), &bi); err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *failClosedHub) dvName(digest string) string { return cdi.DataVolumeName(h.image, digest) }

// served makes the finished import of digest from url, as a syncer made
// it: the DataVolume (its status Succeeded, as CDI would leave it), its
// volume, and the DataSource pointing there.
func (h *failClosedHub) served(t *testing.T, bi *v1alpha1.BaseImage, digest, url string) {
	t.Helper()
	im := cdi.Import{Namespace: "acme", Tenant: "acme", Image: h.image, Registry: "registry.example.com", Repository: "acme/rhel", Tag: "9",
		Digest: digest, Canonical: strings.TrimPrefix(url, "docker://registry.example.com/acme/rhel@"), VirtualSize: 512 << 20,
		Storage: cdi.Storage{StorageClass: harness.SyncerStorageClass, AccessMode: corev1.ReadWriteMany, VolumeMode: corev1.PersistentVolumeBlock}}
	dv, err := im.DataVolume()
	if err != nil {
		t.Fatal(err)
	}
	dv.Labels[cdi.LabelBaseImage] = bi.Name
	h.cluster.Create(t, dv)
	dv.Status.Phase = cdiv1.Succeeded
	if err := h.cluster.Client.Status().Update(t.Context(), dv); err != nil {
		t.Fatal(err)
	}
	class := harness.SyncerStorageClass
	h.cluster.Create(t, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: dv.Name, Namespace: "acme", Labels: dv.Labels,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: cdiv1.SchemeGroupVersion.String(), Kind: "DataVolume", Name: dv.Name, UID: dv.UID}}},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &class, AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("512Mi")}}},
	})
	ds := im.DataSource(bi.Name, dv.Name)
	ds.Labels[cdi.LabelBaseImage] = bi.Name
	ds.Labels[cdi.LabelTag] = cdi.LabelValue("9")
	h.cluster.Create(t, ds)
}

// reconcile runs the reconciler until it asks for nothing sooner than a
// recheck, at most a few rounds, and returns the BaseImage as stored.
func (h *failClosedHub) reconcile(t *testing.T) (*v1alpha1.BaseImage, error) {
	t.Helper()
	var err error
	for range 5 {
		var res reconcile.Result
		res, err = h.r.Reconcile(quietContext(t), reconcile.Request{NamespacedName: h.key})
		if err != nil || res.RequeueAfter > 5*time.Second || res.RequeueAfter == 0 {
			break
		}
	}
	var bi v1alpha1.BaseImage
	if gerr := h.cluster.Client.Get(t.Context(), h.key, &bi); gerr != nil {
		t.Fatal(gerr)
	}
	return &bi, err
}

// dataVolumes lists the DataVolumes of acme, by name, with their URLs.
func (h *failClosedHub) dataVolumes(t *testing.T) map[string]string {
	t.Helper()
	var list cdiv1.DataVolumeList
	if err := h.cluster.Client.List(t.Context(), &list, client.InNamespace("acme")); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, dv := range list.Items {
		if dv.DeletionTimestamp.IsZero() {
			out[dv.Name] = *dv.Spec.Source.Registry.URL
		}
	}
	return out
}

// dataSourcePVC is the volume the tag's DataSource points at, "" for none.
func (h *failClosedHub) dataSourcePVC(t *testing.T) string {
	t.Helper()
	var ds cdiv1.DataSource
	if err := h.cluster.Client.Get(t.Context(), h.key, &ds); err != nil {
		if apierrors.IsNotFound(err) {
			return ""
		}
		t.Fatal(err)
	}
	if ds.Spec.Source.PVC == nil {
		return ""
	}
	return ds.Spec.Source.PVC.Name
}

// oldSyncerStatus is what an image-syncer before the gate wrote for an
// image it had checked itself: the digest observed, no canonical digest,
// not rejected.
func oldSyncerStatus(digest string, phase v1alpha1.Phase) v1alpha1.BaseImageStatus {
	return v1alpha1.BaseImageStatus{
		Phase: phase, ObservedDigest: digest, ShortDigest: strings.TrimPrefix(digest, "sha256:")[:12],
		Conditions: []metav1.Condition{{Type: v1alpha1.ConditionRejected, Status: metav1.ConditionFalse, Reason: "Validated", Message: "validated by image-syncer", LastTransitionTime: metav1.Now()}},
	}
}

// TestNoImportWithoutAVerdictWhateverTheStatusSays: a BaseImage whose
// status says its digest was observed and admitted, but whose verdict
// refuses it, is missing, or is unreadable, gets no DataVolume; and the
// pushed digest is never imported in place of a canonical one.
func TestNoImportWithoutAVerdictWhateverTheStatusSays(t *testing.T) {
	t.Parallel()
	digest := "sha256:" + strings.Repeat("5", 64)
	for _, tc := range []struct {
		name   string
		answer func(name.Digest) (*api.Verdict, error)
		phase  v1alpha1.Phase
	}{
		{"refused", refused, v1alpha1.PhaseRejected},
		{"no verdict", nil, v1alpha1.PhasePending},
		{"registry unreachable", unreachable, v1alpha1.PhaseImporting},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newFailClosedHub(t, digest, oldSyncerStatus(digest, v1alpha1.PhaseImporting), "")
			if tc.answer != nil {
				h.gate.set(digest, tc.answer)
			}
			bi, err := h.reconcile(t)
			if dvs := h.dataVolumes(t); len(dvs) != 0 {
				t.Fatalf("DataVolumes %v created for a digest without an accepted verdict (reconcile error %v)", dvs, err)
			}
			if bi.Status.Phase != tc.phase || bi.Status.CanonicalDigest != "" {
				t.Errorf("phase %s, canonical %q; want %s and no canonical digest", bi.Status.Phase, bi.Status.CanonicalDigest, tc.phase)
			}
			// Accepted at last, the canonical image is imported, never the pushed one.
			canonical := "sha256:" + strings.Repeat("6", 64)
			h.gate.set(digest, accepted(canonical))
			if _, err := h.reconcile(t); err != nil {
				t.Fatal(err)
			}
			want := "docker://registry.example.com/acme/rhel@" + canonical
			if dvs := h.dataVolumes(t); len(dvs) != 1 || dvs[h.dvName(digest)] != want {
				t.Errorf("once accepted: DataVolumes %v; want %s importing %s", dvs, h.dvName(digest), want)
			}
		})
	}
}

// TestAServedImageIsWithdrawnWhenItsVerdictIsNot: an image a hub serves
// stops being served when its verdict refuses it (its import is then
// deleted), when its verdict is gone (its import kept for the verdict to
// come back), and when its volume was imported from the pushed digest
// rather than the canonical image (replaced by an import of the canonical
// one). A registry that cannot be read withdraws nothing.
func TestAServedImageIsWithdrawnWhenItsVerdictIsNot(t *testing.T) {
	t.Parallel()
	digest := "sha256:" + strings.Repeat("7", 64)
	canonical := "sha256:" + strings.Repeat("8", 64)
	pushedURL := "docker://registry.example.com/acme/rhel@" + digest
	canonicalURL := "docker://registry.example.com/acme/rhel@" + canonical
	for _, tc := range []struct {
		name       string
		answer     func(name.Digest) (*api.Verdict, error)
		servedFrom string
		// After the reconcile: is the volume still served, and which
		// DataVolumes are left (name → URL)?
		serving bool
		dvs     map[string]string
		phase   v1alpha1.Phase
	}{
		{"refused", refused, pushedURL, false, map[string]string{}, v1alpha1.PhaseRejected},
		{"verdict gone", nil, pushedURL, false, map[string]string{"": pushedURL}, v1alpha1.PhasePending},
		{"signed only by a removed key", untrusted, pushedURL, false, map[string]string{"": pushedURL}, v1alpha1.PhasePending},
		{"imported from the pushed digest", accepted(canonical), pushedURL, false, map[string]string{"": canonicalURL}, v1alpha1.PhaseImporting},
		{"registry unreachable", unreachable, pushedURL, true, map[string]string{"": pushedURL}, v1alpha1.PhaseReady},
		{"accepted", accepted(""), pushedURL, true, map[string]string{"": pushedURL}, v1alpha1.PhaseReady},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newFailClosedHub(t, digest, oldSyncerStatus(digest, v1alpha1.PhaseReady), tc.servedFrom)
			if tc.answer != nil {
				h.gate.set(digest, tc.answer)
			}
			bi, err := h.reconcile(t)
			if (err != nil) != (tc.name == "registry unreachable") {
				t.Errorf("reconcile: %v", err)
			}
			if got := h.dataSourcePVC(t); (got != "") != tc.serving {
				t.Errorf("the DataSource points at %q; serving %v wanted", got, tc.serving)
			}
			ready := meta.FindStatusCondition(bi.Status.Conditions, v1alpha1.ConditionReady)
			if !tc.serving && (ready == nil || ready.Status != metav1.ConditionFalse || ready.Reason != "Withdrawn" || bi.Status.ImportedDigest != "") {
				t.Errorf("withdrawn, the BaseImage says Ready %+v, imported %q; want Ready False, Withdrawn, and why", ready, bi.Status.ImportedDigest)
			}
			if bi.Status.Phase != tc.phase {
				t.Errorf("phase %s, want %s", bi.Status.Phase, tc.phase)
			}
			want := map[string]string{}
			for _, url := range tc.dvs {
				want[h.dvName(digest)] = url
			}
			if got := h.dataVolumes(t); !equalMaps(got, want) {
				t.Errorf("DataVolumes %v, want %v", got, want)
			}
		})
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestImagesTheSyncerDoesNotRefreshAreStillHeldToTheirVerdicts: two kinds
// of BaseImage are not imported again, and so were read only at import:
// one whose tag left the registry under the retain policy, and one named
// otherwise than the syncer names it (an older syncer's naming, or made by
// hand). Each still stops serving when no trusted verdict admits what it
// serves; a retained image whose verdicts went with it is kept, as the
// retain policy promises.
func TestImagesTheSyncerDoesNotRefreshAreStillHeldToTheirVerdicts(t *testing.T) {
	t.Parallel()
	digest := "sha256:" + strings.Repeat("6", 64)
	pushedURL := "docker://registry.example.com/acme/rhel@" + digest
	for _, tc := range []struct {
		name      string
		handNamed bool
		answer    func(name.Digest) (*api.Verdict, error)
		serving   bool
	}{
		{"retained, refused", false, refused, false},
		{"retained, only an untrusted verdict", false, untrusted, false},
		{"retained, its verdicts gone with it", false, nil, true},
		{"retained, accepted", false, accepted(""), true},
		{"named otherwise, accepted", true, accepted(""), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			st := oldSyncerStatus(digest, v1alpha1.PhaseReady)
			h := newFailClosedHub(t, digest, st, "")
			var bi v1alpha1.BaseImage
			if err := h.cluster.Client.Get(t.Context(), h.key, &bi); err != nil {
				t.Fatal(err)
			}
			if tc.handNamed {
				other := &v1alpha1.BaseImage{ObjectMeta: metav1.ObjectMeta{Name: "rhel-9", Namespace: "acme", Labels: bi.Labels}, Spec: bi.Spec}
				h.cluster.Create(t, other)
				h.key.Name, bi = other.Name, *other
			} else {
				if bi.Annotations == nil {
					bi.Annotations = map[string]string{}
				}
				bi.Annotations[v1alpha1.AnnotationRemoved] = time.Now().UTC().Format(time.RFC3339)
				if err := h.cluster.Client.Update(t.Context(), &bi); err != nil {
					t.Fatal(err)
				}
			}
			h.served(t, &bi, digest, pushedURL)
			st.ImportedDigest, st.PVCName, st.DataSourceName = digest, h.dvName(digest), bi.Name
			st.Imports = []v1alpha1.ImportRecord{{Digest: digest, DataVolume: h.dvName(digest), CompletedAt: metav1.Now()}}
			bi.Status = st
			if err := h.cluster.Client.Status().Update(t.Context(), &bi); err != nil {
				t.Fatal(err)
			}
			if tc.answer != nil {
				h.gate.set(digest, tc.answer)
			}
			got, err := h.reconcile(t)
			if err != nil {
				t.Errorf("reconcile: %v", err)
			}
			if pvc := h.dataSourcePVC(t); (pvc != "") != tc.serving {
				t.Errorf("the DataSource points at %q; serving %v wanted", pvc, tc.serving)
			}
			ready := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionReady)
			if !tc.serving && (ready == nil || ready.Status != metav1.ConditionFalse || got.Status.ImportedDigest != "") {
				t.Errorf("withdrawn, the BaseImage says Ready %+v, imported %q; want Ready False and why", ready, got.Status.ImportedDigest)
			}
		})
	}
}

// TestTheGuestGivesTheImageItsPreference: a verdict whose guest report
// names RHEL 9.4 gives the import KubeVirt's default-preference label
// rhel.9, of kind VirtualMachineClusterPreference, which virtctl's
// --infer-preference and KubeVirt's inferFromVolume read; a preference
// the tenant declared wins.
func TestTheGuestGivesTheImageItsPreference(t *testing.T) {
	t.Parallel()
	digest := "sha256:" + strings.Repeat("5", 64)
	for _, tc := range []struct {
		name, declared, want string
	}{
		{"inferred", "", "rhel.9"},
		{"declared", "fedora", "fedora"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newFailClosedHub(t, digest, v1alpha1.BaseImageStatus{}, "")
			h.gate.set(digest, func(subject name.Digest) (*api.Verdict, error) {
				v, err := accepted("")(subject)
				v.Images[0].Preference = tc.declared
				v.Images[0].Guest = &api.GuestReport{PartitionTable: "gpt", OS: &api.GuestOS{ID: "rhel", VersionID: "9.4"}}
				return v, err
			})
			if _, err := h.reconcile(t); err != nil {
				t.Fatal(err)
			}
			var dv cdiv1.DataVolume
			if err := h.cluster.Client.Get(t.Context(), client.ObjectKey{Namespace: "acme", Name: h.dvName(digest)}, &dv); err != nil {
				t.Fatal(err)
			}
			if got := dv.Labels["instancetype.kubevirt.io/default-preference"]; got != tc.want {
				t.Errorf("the DataVolume's default-preference is %q, want %q (labels %v)", got, tc.want, dv.Labels)
			}
			if got := dv.Labels["instancetype.kubevirt.io/default-preference-kind"]; got != "VirtualMachineClusterPreference" {
				t.Errorf("the DataVolume's default-preference-kind is %q, want VirtualMachineClusterPreference (labels %v)", got, dv.Labels)
			}
		})
	}
}

// TestAHubMayHoldImagesWhoseGuestIsUnknown: a guest the gate could not
// read is a note in the verdict, never the gate's refusal; what to do
// with it is the hub provider's policy. By default the image is imported;
// with --unknown-guests hold it is refused on that hub as unknown-guest,
// with the gate's notes, and nothing is imported; an image whose guest
// is known is imported either way.
func TestAHubMayHoldImagesWhoseGuestIsUnknown(t *testing.T) {
	t.Parallel()
	digest := "sha256:" + strings.Repeat("6", 64)
	unknown := &api.GuestReport{PartitionTable: "unknown", Notes: []string{"no partition table or filesystem recognised"}}
	known := &api.GuestReport{PartitionTable: "gpt", OS: &api.GuestOS{ID: "debian", VersionID: "12"}}
	for _, tc := range []struct {
		name    string
		hold    bool
		guest   *api.GuestReport
		imports bool
	}{
		{"unknown, imported by default", false, unknown, true},
		{"unknown, held", true, unknown, false},
		{"no report, held", true, nil, false},
		{"known, held hub", true, known, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newFailClosedHub(t, digest, v1alpha1.BaseImageStatus{}, "")
			h.r.HoldUnknownGuests = tc.hold
			h.gate.set(digest, func(subject name.Digest) (*api.Verdict, error) {
				v, err := accepted("")(subject)
				v.Images[0].Guest = tc.guest
				return v, err
			})
			bi, err := h.reconcile(t)
			if err != nil {
				t.Fatal(err)
			}
			imported := len(h.dataVolumes(t)) > 0
			if imported != tc.imports {
				t.Fatalf("imported: %v, want %v; status %+v", imported, tc.imports, bi.Status)
			}
			rejected := meta.FindStatusCondition(bi.Status.Conditions, v1alpha1.ConditionRejected)
			if !tc.imports && (rejected == nil || rejected.Status != metav1.ConditionTrue || !strings.Contains(rejected.Message, "unknown-guest") ||
				(tc.guest != nil && !strings.Contains(rejected.Message, tc.guest.Notes[0]))) {
				t.Errorf("the held image's Rejected condition: %+v", rejected)
			}
		})
	}
}

// TestAHubMayRequireThatImagesBooted: with --require-boot a hub imports
// only images whose verdict says the gate's boot check saw them boot; an
// image that did not boot is refused there as not-booted with the gate's
// reason and the console's last line, and so is one the gate did not
// boot at all (a verdict from before the check, or a gate without it).
// Without the flag, a boot that failed does not stop the import.
func TestAHubMayRequireThatImagesBooted(t *testing.T) {
	t.Parallel()
	digest := "sha256:" + strings.Repeat("7", 64)
	guest := func(b *api.GuestBoot) *api.GuestReport {
		return &api.GuestReport{PartitionTable: "mbr", OS: &api.GuestOS{ID: "debian", VersionID: "12"}, Boot: b}
	}
	failed := &api.GuestBoot{Firmware: "bios", Accelerator: "tcg", Reason: "no boot signal within 5m0s", LastLines: []string{"Booting from Hard Disk...", "No bootable device."}}
	for _, tc := range []struct {
		name    string
		require bool
		guest   *api.GuestReport
		imports bool
		says    string
	}{
		{"booted", true, guest(&api.GuestBoot{Booted: true, Firmware: "bios", Accelerator: "tcg", Signal: "debian login: "}), true, ""},
		{"did not boot", true, guest(failed), false, `no boot signal within 5m0s; its console's last line: "No bootable device."`},
		{"not booted by the gate", true, guest(nil), false, "no boot check in its verdict"},
		{"no guest report", true, nil, false, "no boot check in its verdict"},
		{"did not boot, not required", false, guest(failed), true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newFailClosedHub(t, digest, v1alpha1.BaseImageStatus{}, "")
			h.r.RequireBoot = tc.require
			h.gate.set(digest, func(subject name.Digest) (*api.Verdict, error) {
				v, err := accepted("")(subject)
				v.Images[0].Guest = tc.guest
				return v, err
			})
			bi, err := h.reconcile(t)
			if err != nil {
				t.Fatal(err)
			}
			if imported := len(h.dataVolumes(t)) > 0; imported != tc.imports {
				t.Fatalf("imported: %v, want %v; status %+v", imported, tc.imports, bi.Status)
			}
			rejected := meta.FindStatusCondition(bi.Status.Conditions, v1alpha1.ConditionRejected)
			if !tc.imports && (rejected == nil || rejected.Status != metav1.ConditionTrue || !strings.Contains(rejected.Message, "not-booted") || !strings.Contains(rejected.Message, tc.says)) {
				t.Errorf("the Rejected condition: %+v; want not-booted saying %s", rejected, tc.says)
			}
		})
	}
}
