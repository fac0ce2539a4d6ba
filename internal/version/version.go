package version

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/imagepipe/imagepipe/pkg/api"
)

// Version is the release version, set at link time with
//
//	-ldflags "-X github.com/imagepipe/imagepipe/internal/version.Version=v1.2.3"
//
// (the Makefile passes `git describe --always --dirty`). A plain `go build`
// leaves it "dev".
var Version = "dev"

// Commit is the VCS revision, set at link time like Version by builds
// that record none of their own: the container images are built with
// -buildvcs=false, so that the same commit gives the same image whether
// it was checked out as a clone, a worktree or an unpacked tarball. The
// revision the Go toolchain records, when there is one, wins.
var Commit = ""

// Info describes the running build. It is api.VersionInfo, the JSON model
// `imagectl version -o json` prints (convert with api.VersionInfo(info)),
// with the one-line form String.
type Info api.VersionInfo

// Get returns the running binary's build information.
func Get() Info {
	info := Info{
		Version:   Version,
		Commit:    Commit,
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
