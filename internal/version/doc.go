// Package version says which build of imagepipe is running: the release
// version stamped in at link time, the commit and the Go toolchain, read
// from the binary's own build information.
package version
