// Package cdi is the vocabulary imagepipe speaks to CDI: the Kubernetes
// names of what the syncer makes (names.go), the labels and annotations
// that record whose an object is, the Import that builds a digest-pinned
// DataVolume and the DataSource serving it (objects.go), the guest's facts
// a DataSource carries for vm create (guest.go), and the choice of volume
// shape from a StorageClass's profile (storage.go).
//
// It holds no control loop: the hub package drives BaseImages with it, and
// vmlaunch names and sizes the disks it clones from them.
package cdi
