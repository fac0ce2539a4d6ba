package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Version is the release version, set at link time with
//
//	-ldflags "-X github.com/imagepipe/imagepipe/internal/version.Version=v1.2.3"
//
// (the Makefile passes `git describe --always --dirty`). A plain `go build`
// leaves it "dev".
var Version = "dev"

// Info describes the running build. Its JSON form is what
// `imagectl version -o json` prints.
type Info struct {
	// Version is the release version (Version above).
	Version string `json:"version"`
	// Commit is the VCS revision the binary was built from, if the build
	// recorded one.
	Commit string `json:"commit,omitempty"`
	// Modified says that the working tree had uncommitted changes.
	Modified bool `json:"modified"`
	// GoVersion is the toolchain that built the binary.
	GoVersion string `json:"goVersion"`
	// Platform is GOOS/GOARCH of the binary.
	Platform string `json:"platform"`
}

// Get returns the running binary's build information.
func Get() Info {
	info := Info{
		Version:   Version,
		GoVersion: runtime.Version(),
		Platform:  runtime.GOOS + "/" + runtime.GOARCH,
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				info.Commit = s.Value
			case "vcs.modified":
				info.Modified = s.Value == "true"
			}
		}
	}
	return info
}

// String is the one-line form, e.g.
// "v0.3.0 (commit 7d70ea7c, go1.26.0, linux/amd64)".
func (i Info) String() string {
	commit := i.Commit
	if len(commit) > 8 {
		commit = commit[:8]
	}
	if commit == "" {
		commit = "unknown"
	}
	if i.Modified {
		commit += "+modified"
	}
	return fmt.Sprintf("%s (commit %s, %s, %s)", i.Version, commit, i.GoVersion, i.Platform)
}
