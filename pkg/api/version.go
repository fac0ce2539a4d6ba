package api

// VersionInfo is what `imagectl version -o json|yaml` prints: which build
// of imagepipe is running.
type VersionInfo struct {
	// Version is the release version stamped in at link time
	// (`git describe --always --dirty` in the Makefile), or "dev" for a
	// plain `go build`.
	Version string `json:"version"`
	// Commit is the VCS revision the binary was built from, if the build
	// recorded one.
	Commit string `json:"commit,omitempty"`
	// Modified says that the working tree had uncommitted changes.
	Modified bool `json:"modified"`
	// GoVersion is the toolchain that built the binary, e.g. "go1.26.0".
	GoVersion string `json:"goVersion"`
	// Platform is GOOS/GOARCH of the binary, e.g. "linux/amd64".
	Platform string `json:"platform"`
}
