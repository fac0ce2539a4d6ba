package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Phase is where a BaseImage's replication stands.
// +kubebuilder:validation:Enum=Pending;Importing;Ready;Failed;Rejected;Deleted
type Phase string

// Phases of a BaseImage.
const (
	PhasePending   Phase = "Pending"   // known, not yet imported
	PhaseImporting Phase = "Importing" // a DataVolume is importing the digest
	PhaseReady     Phase = "Ready"     // the DataSource points at a finished import
	PhaseFailed    Phase = "Failed"    // the import kept failing; retries stopped
	PhaseRejected  Phase = "Rejected"  // revalidation refused the image
	PhaseDeleted   Phase = "Deleted"   // the tag is gone from the registry; retained per policy
)

// Condition types of a BaseImage.
const (
	ConditionReady          = "Ready"
	ConditionProgressing    = "Progressing"
	ConditionRejected       = "Rejected"
	ConditionLiveMigratable = "LiveMigratable"
)

// DeletionPolicy says what happens on a hub when a tag leaves the registry.
// +kubebuilder:validation:Enum=retain;delete
type DeletionPolicy string

// Deletion policies; the default is retain.
const (
	DeletionRetain DeletionPolicy = "retain"
	DeletionDelete DeletionPolicy = "delete"
)

// BaseImageSpec names a tenant image tag in the central registry.
type BaseImageSpec struct {
	// Tenant owns the image: the first path component of Repository.
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`
	Tenant string `json:"tenant"`
	// Repository is the registry repository, "REGISTRY/TENANT/NAME".
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	Repository string `json:"repository"`
	// Tag is the image tag.
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$`
	Tag string `json:"tag"`
	// Digest is the manifest digest the tag points at, as last seen.
	// +kubebuilder:validation:Pattern=`^sha256:[a-f0-9]{64}$`
	// +optional
	Digest string `json:"digest,omitempty"`
	// Retention says how many imports to keep and what to do when the tag
	// is deleted.
	// +optional
	Retention *Retention `json:"retention,omitempty"`
}

// Retention bounds the imports kept for a BaseImage.
type Retention struct {
	// Keep is how many successful imports stay (the current one included).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10
	// +kubebuilder:default=2
	// +optional
	Keep int32 `json:"keep,omitempty"`
	// OnDelete is the policy when the tag disappears from the registry.
	// +kubebuilder:default=retain
	// +optional
	OnDelete DeletionPolicy `json:"onDelete,omitempty"`
}

// BaseImageStatus reports the replication of the image onto this hub.
type BaseImageStatus struct {
	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Phase summarises the state.
	// +optional
	Phase Phase `json:"phase,omitempty"`
	// ObservedDigest is the newest digest seen for the tag.
	// +optional
	ObservedDigest string `json:"observedDigest,omitempty"`
	// ShortDigest is the first 12 hex digits of ObservedDigest, for listings.
	// +optional
	ShortDigest string `json:"shortDigest,omitempty"`
	// ImportedDigest is the digest the DataSource currently serves.
	// +optional
	ImportedDigest string `json:"importedDigest,omitempty"`
	// DataSourceName is the DataSource VMs clone from.
	// +optional
	DataSourceName string `json:"dataSourceName,omitempty"`
	// PVCName is the volume behind the current import.
	// +optional
	PVCName string `json:"pvcName,omitempty"`
	// Progress is the import progress CDI reports, e.g. "45.2%".
	// +optional
	Progress string `json:"progress,omitempty"`
	// CanonicalDigest is the manifest digest of the image CDI imports for
	// ObservedDigest: the canonical containerDisk the gate wrote after it
	// verified the pushed image in full (equal to ObservedDigest for an
	// image imagectl built), for this hub's architecture.
	// +optional
	CanonicalDigest string `json:"canonicalDigest,omitempty"`
	// VirtualSize is the disk's virtual size in bytes.
	// +optional
	VirtualSize int64 `json:"virtualSize,omitempty"`
	// DiskSize is the size in bytes of the disk file in the image's layer
	// (disk/disk.img as stored: qcow2 or raw). CDI's importer first writes
	// that file to a scratch volume of the DataVolume's requested size, so
	// the request leaves room for it.
	// +optional
	DiskSize int64 `json:"diskSize,omitempty"`
	// Instancetype and Preference are the image's hints for VMs made from
	// it, as the gate's verdict records them.
	// +optional
	Instancetype string `json:"instancetype,omitempty"`
	// +optional
	Preference string `json:"preference,omitempty"`
	// Attempts counts failed imports of ObservedDigest; retries stop at a bound.
	// +optional
	Attempts int32 `json:"attempts,omitempty"`
	// LastFailure is when the latest import attempt of ObservedDigest failed;
	// the next one waits for the retry delay after it.
	// +optional
	LastFailure *metav1.Time `json:"lastFailure,omitempty"`
	// Imports are the successful imports kept on the hub, newest first;
	// the first is the one the DataSource serves. Older ones beyond
	// Retention.Keep are deleted.
	// +kubebuilder:validation:MaxItems=10
	// +optional
	Imports []ImportRecord `json:"imports,omitempty"`
	// Conditions: Ready, Progressing, Rejected and LiveMigratable.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ImportRecord is one finished import of a digest.
type ImportRecord struct {
	// Digest is the manifest digest imported.
	Digest string `json:"digest"`
	// DataVolume names the DataVolume, and the PVC, holding the disk.
	DataVolume string `json:"dataVolume"`
	// CompletedAt is when the syncer saw the import succeed.
	CompletedAt metav1.Time `json:"completedAt"`
}

// Annotations the syncer keeps on a BaseImage.
const (
	// AnnotationRemoved is set, to the time it was confirmed, when the tag
	// is gone from the registry; the deletion policy then applies.
	AnnotationRemoved = "imagepipe.io/removed-from-registry"
	// AnnotationSeenAt is when the syncer learnt of spec.digest (RFC 3339
	// with nanoseconds), for the event-to-import latency metric.
	AnnotationSeenAt = "imagepipe.io/seen-at"
	// AnnotationRetry, set by a user on a Failed BaseImage, starts its
	// imports over; the syncer removes it.
	AnnotationRetry = "imagepipe.io/retry"
	// AnnotationAttachedAt is when a replica that does not lead learnt
	// that something was attached to spec.digest (a verdict, a
	// signature), so that the leader looks for the verdict again at once.
	AnnotationAttachedAt = "imagepipe.io/attached-at"
)

// BaseImage is one tenant image tag replicated onto this hub as a CDI
// DataVolume and DataSource.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=bi,categories=imagepipe
// +kubebuilder:printcolumn:name="Tenant",type=string,JSONPath=`.spec.tenant`
// +kubebuilder:printcolumn:name="Image",type=string,JSONPath=`.spec.repository`
// +kubebuilder:printcolumn:name="Tag",type=string,JSONPath=`.spec.tag`
// +kubebuilder:printcolumn:name="Digest",type=string,JSONPath=`.status.shortDigest`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type BaseImage struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   BaseImageSpec   `json:"spec,omitempty"`
	Status BaseImageStatus `json:"status,omitempty"`
}

// BaseImageList is a list of BaseImages.
//
// +kubebuilder:object:root=true
type BaseImageList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []BaseImage `json:"items"`
}
