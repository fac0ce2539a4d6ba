// Package commands tests imagectl's registry commands — list, inspect
// docker://, export, delete and copy — as a user runs them, against the real
// CNCF distribution registry, with images pushed by `imagectl import`,
// qemu-img as the oracle for exported disks and skopeo as an independent
// client.
package commands
