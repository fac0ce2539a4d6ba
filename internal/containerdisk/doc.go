// Package containerdisk is the KubeVirt containerDisk format: it builds the
// single layer that holds a disk, assembles the image's config and
// manifest around it (AssembleImage, for imagectl and the gate alike), and
// checks a layer read from a registry.
//
// A containerDisk layer is a tar holding exactly the directory disk/ (0555)
// and the regular file disk/disk.img (0444), both owned 107:107, the qemu
// user KubeVirt runs as. WriteLayer (or Disk.WriteLayer) builds it from a
// disk whose size is fixed before its first byte is written, compressed
// with gzip (Intel ISA-L's igzip with the isal build tag and cgo,
// klauspost/pgzip otherwise), zstd or not at all. The bytes depend only on
// the disk and the compression: fixed tar headers, no timestamps, and
// compressors that cut their input into fixed blocks, so the same source
// gives the same layer digest whatever the machine's concurrency. No layer
// is shorter than the 512 bytes CDI's importer reads to detect its format:
// a gzip layer that would be gets a padded header.
//
// OpenLayer reads a layer as it streams in and checks its shape up to the
// disk's first byte; a layer that is not a containerDisk is a
// *reject.Error with a shape reason, which matches reject.ErrRejected like
// a rejection of the disk itself.
// CheckHead then runs the disk engine's header checks on the disk's first
// cluster, and CopyDisk extracts the whole disk.
//
// It knows the disk engine and no network: registries are not its job.
package containerdisk
