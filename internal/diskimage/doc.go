// Package diskimage reads a containerDisk as an OCI image from a
// registry: Check describes the image at a reference and checks that it
// is a containerDisk imagepipe accepts, reading only its layer's head;
// Extract streams its disk out. Both resolve an image index to the
// image for the client's platform (registry.Client.PlatformImage).
//
// The containerDisk's bytes (the layer, and the config and manifest
// around it) are internal/containerdisk's; the protocol is
// internal/registry's. A rejection is a *reject.Error, as containerdisk
// gives it.
package diskimage
