// Package diskimage reads containerDisks as OCI images from a registry:
// List and ListRepository describe a tenant's or a repository's images
// from their annotations; Check describes the image at a reference and
// checks that it is a containerDisk imagepipe accepts, reading only its
// layer's head; Extract streams its disk out. Both resolve an image index to the
// image for the client's platform (registry.Client.PlatformImage).
//
// The containerDisk's bytes (the layer, and the config and manifest
// around it) are internal/containerdisk's; the protocol is
// internal/registry's. A rejection is a *reject.Error, as containerdisk
// gives it.
package diskimage
