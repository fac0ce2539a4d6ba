package version

import (
	"runtime"
	"strings"
	"testing"
)

func TestGetReportsTheStampedVersionAndCommit(t *testing.T) {
	oldV, oldC := Version, Commit
	t.Cleanup(func() { Version, Commit = oldV, oldC })
	Version, Commit = "v1.2.3", "0123456789abcdef0123456789abcdef01234567"

	info := Get()
	// A test binary records no VCS revision, so the stamped one is used.
	if info.Version != "v1.2.3" || info.Commit != Commit || info.Platform != runtime.GOOS+"/"+runtime.GOARCH || info.GoVersion != runtime.Version() {
		t.Errorf("Get() = %+v", info)
	}
	if s := info.String(); !strings.HasPrefix(s, "v1.2.3 (commit 01234567, go") {
		t.Errorf("String() = %q", s)
	}
	Commit = ""
	if s := Get().String(); !strings.Contains(s, "commit unknown") {
		t.Errorf("without a commit, String() = %q", s)
	}
}
