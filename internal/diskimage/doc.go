// Package diskimage is a containerDisk as an OCI image: it assembles the
// image's config and manifest around its one layer. It is the one place
// that decides those bytes, so that the image imagectl import pushes and
// the canonical image the gate publishes of the same disk, with the same
// config values and annotations, are byte for byte the same image.
//
// Assemble takes final values and adds nothing of its own: no time, no
// defaults, no labels. The layer itself is internal/containerdisk's.
package diskimage
