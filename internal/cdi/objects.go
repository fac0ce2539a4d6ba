package cdi

import (
	"errors"
	"fmt"
	"strings"

	"github.com/opencontainers/go-digest"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"

	"github.com/imagepipe/imagepipe/pkg/api"
)

// Labels the syncer puts on what it creates.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	LabelTenant    = "imagepipe.io/tenant"
	LabelImage     = "imagepipe.io/image"
	LabelDigest    = "imagepipe.io/digest" // first 12 hex digits: label values are short
	ManagedByValue = "image-syncer"
	// AnnotationRepository, AnnotationTag and AnnotationDigest record the
	// exact repository ("REGISTRY/TENANT/PATH"), tag and digest an object
	// was made for; the syncer compares them before it changes or deletes
	// the object, never trusting its name alone.
	AnnotationRepository = "imagepipe.io/repository"
	AnnotationTag        = "imagepipe.io/tag"
	AnnotationDigest     = "imagepipe.io/digest"
	instancetypeKey      = "instancetype.kubevirt.io/default-instancetype"
	preferenceKey        = "instancetype.kubevirt.io/default-preference"
	// preferenceKindKey is KubeVirt's kind of the default preference
	// (kubevirt.io/api instancetype.DefaultPreferenceKindLabel).
	preferenceKindKey = "instancetype.kubevirt.io/default-preference-kind"
	// ClusterPreferenceKind is the kind of every preference imagepipe
	// names: common-instancetypes' are cluster-wide.
	ClusterPreferenceKind = "VirtualMachineClusterPreference"
)

// HintLabels are the KubeVirt hint labels the syncer sets from an Import:
// it removes those the Import no longer sets.
var HintLabels = []string{instancetypeKey, preferenceKey, preferenceKindKey}

// DefaultFilesystemOverhead is CDI's default share of a Filesystem-mode
// volume reserved for the filesystem: 5.5%.
const DefaultFilesystemOverhead = 0.055

// Storage is the volume shape chosen from the StorageClass's profile.
type Storage struct {
	StorageClass string
	AccessMode   corev1.PersistentVolumeAccessMode
	VolumeMode   corev1.PersistentVolumeMode
	// FilesystemOverhead is the share reserved in Filesystem mode.
	FilesystemOverhead float64
}

// Spec is the CDI storage request for a volume of this shape holding
// size bytes. Every volume imagepipe asks for (imports, VM root disks,
// blank volumes) is built here, so they agree on class, access and mode.
func (st Storage) Spec(size resource.Quantity) *cdiv1.StorageSpec {
	mode := st.VolumeMode
	spec := &cdiv1.StorageSpec{
		AccessModes: []corev1.PersistentVolumeAccessMode{st.AccessMode},
		VolumeMode:  &mode,
		Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
	}
	if st.StorageClass != "" {
		class := st.StorageClass
		spec.StorageClassName = &class
	}
	return spec
}

// Import describes one digest of one image to import onto a hub.
type Import struct {
	Namespace  string
	Tenant     string
	Image      string // ImageName of the repository
	Registry   string // host[:port]
	Repository string // "TENANT/NAME"
	Tag        string // the tag the DataSource serves
	Digest     string // the digest pushed under the tag
	// Canonical is the digest CDI imports: the canonical image of Digest
	// for this hub, as an accepted, trusted verdict of the gate names it.
	// It has no default: without it there is no DataVolume.
	Canonical   string
	VirtualSize int64
	// DiskSize is the size of the disk file in the layer, which CDI's
	// importer writes to its scratch volume before converting it.
	DiskSize   int64
	PullMethod cdiv1.RegistryPullMethod // pod (default) or node
	SecretRef  string                   // pull secret in Namespace, if the registry needs one
	CertConfig string                   // CA ConfigMap in Namespace, if the registry needs one
	Storage    Storage
	// Instancetype and Preference are the image's hints, copied to labels;
	// a preference is labelled ClusterPreferenceKind, the one kind a
	// tenant's image or the syncer's table can name.
	Instancetype, Preference string
	// Guest is what the gate read in the disk, published on the
	// DataSource (GuestFacts); nil publishes nothing.
	Guest *api.GuestReport
	// Architecture, when set, is the platform CDI picks from an image
	// index (DataVolume registry platform.architecture).
	Architecture string
}

// VolumeSize is the requested size, rounded up to whole MiB: room for the
// virtual size (plus the filesystem overhead in Filesystem mode), and room
// in a filesystem for the disk file as stored in the layer. CDI's importer
// writes that file to a scratch claim (Filesystem) that copies the
// DataVolume's request, then converts it into the volume; so a Block
// volume of exactly the virtual size cannot take a fully allocated raw
// disk ("no space left on device" on /scratch, importer restarted forever).
// The disk file counts only up to maxDiskFile of the virtual size: no valid
// qcow2 or raw file is larger, and a file padded beyond it (its layer may
// compress to almost nothing) must not inflate the volume a hub allocates.
func (im Import) VolumeSize() resource.Quantity {
	overhead := im.Storage.FilesystemOverhead
	if overhead <= 0 {
		overhead = DefaultFilesystemOverhead
	}
	size := float64(im.VirtualSize)
	if im.Storage.VolumeMode != corev1.PersistentVolumeBlock {
		size /= 1 - overhead
	}
	disk := min(im.DiskSize, maxDiskFile(im.VirtualSize))
	size = max(size, float64(disk)/(1-overhead))
	const mib = 1 << 20
	mibs := (int64(size) + mib - 1) / mib
	return *resource.NewQuantity(mibs*mib, resource.BinarySI)
}

// maxDiskFile bounds the disk file of a disk of virtual size bytes: the
// data itself plus an eighth for qcow2's tables (L2 and refcount entries
// take at most 1/50 of the data at the smallest, 512-byte clusters) and
// compressed clusters a little larger than their data, plus 1 MiB of
// headers.
func maxDiskFile(virtual int64) int64 { return virtual + virtual/8 + 1<<20 }

func (im Import) labels() map[string]string {
	l := map[string]string{
		LabelManagedBy: ManagedByValue,
		LabelTenant:    im.Tenant,
		LabelImage:     im.Image,
		LabelDigest:    strings.TrimPrefix(im.Digest, "sha256:")[:12],
	}
	if im.Instancetype != "" {
		l[instancetypeKey] = im.Instancetype
	}
	if im.Preference != "" {
		l[preferenceKey] = im.Preference
		l[preferenceKindKey] = ClusterPreferenceKind
	}
	return l
}

// FullRepository is "REGISTRY/TENANT/NAME", as BaseImages record it.
func (im Import) FullRepository() string { return im.Registry + "/" + im.Repository }

// ErrUnverified is DataVolume's error for an Import without the canonical
// digest of a verdict: nothing else may be imported, the pushed digest
// included.
var ErrUnverified = errors.New("no verified canonical digest to import")

// URL is the digest-pinned source of the import: the canonical image.
func (im Import) URL() (string, error) {
	if _, err := digest.Parse(im.Canonical); err != nil {
		return "", fmt.Errorf("%w for %s@%s (%q)", ErrUnverified, im.FullRepository(), im.Digest, im.Canonical)
	}
	return "docker://" + im.FullRepository() + "@" + im.Canonical, nil
}

// DataVolume returns the digest-pinned import: the URL always names the
// canonical digest, never the tag nor the pushed digest, so what is
// imported is what the gate verified.
func (im Import) DataVolume() (*cdiv1.DataVolume, error) {
	url, err := im.URL()
	if err != nil {
		return nil, err
	}
	pull := im.PullMethod
	if pull == "" {
		pull = cdiv1.RegistryPullPod
	}
	src := &cdiv1.DataVolumeSourceRegistry{URL: &url, PullMethod: &pull}
	if im.SecretRef != "" {
		src.SecretRef = &im.SecretRef
	}
	if im.CertConfig != "" {
		src.CertConfigMap = &im.CertConfig
	}
	if im.Architecture != "" {
		src.Platform = &cdiv1.PlatformOptions{Architecture: im.Architecture}
	}
	return &cdiv1.DataVolume{
		TypeMeta: metav1.TypeMeta{APIVersion: cdiv1.SchemeGroupVersion.String(), Kind: "DataVolume"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      DataVolumeName(im.Image, im.Digest),
			Namespace: im.Namespace,
			Labels:    im.labels(),
			Annotations: map[string]string{
				// Keep the PVC when the DataVolume object goes: GC decides.
				"cdi.kubevirt.io/storage.deleteAfterCompletion": "false",
				AnnotationRepository:                            im.FullRepository(),
				AnnotationDigest:                                im.Digest,
			},
		},
		Spec: cdiv1.DataVolumeSpec{
			Source:  &cdiv1.DataVolumeSource{Registry: src},
			Storage: im.Storage.Spec(im.VolumeSize()),
		},
	}, nil
}

// DataSource returns the DataSource VMs clone from, pointing at the PVC of
// a finished import, with the guest's facts as annotations.
func (im Import) DataSource(name, pvc string) *cdiv1.DataSource {
	ann := FactsOf(im.Guest).Annotations()
	ann[AnnotationRepository], ann[AnnotationTag] = im.FullRepository(), im.Tag
	return &cdiv1.DataSource{
		TypeMeta: metav1.TypeMeta{APIVersion: cdiv1.SchemeGroupVersion.String(), Kind: "DataSource"},
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: im.Namespace, Labels: im.labels(), Annotations: ann,
		},
		Spec: cdiv1.DataSourceSpec{Source: cdiv1.DataSourceSource{
			PVC: &cdiv1.DataVolumeSourcePVC{Namespace: im.Namespace, Name: pvc},
		}},
	}
}
