package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// versionPkg is where the version and commit are stamped.
const versionPkg = "github.com/imagepipe/imagepipe/internal/version"

// compileOptions say how to build one binary for one platform.
type compileOptions struct {
	binary   string // the command's directory under cmd/
	arch     string // GOARCH; GOOS is linux
	version  string
	revision string
	out      string // the file to write
}

// compile cross-compiles ./cmd/BINARY as a static linux binary. The build
// ignores the caller's GOFLAGS and microarchitecture settings, which
// would make the binary depend on who built it: GOAMD64=v1 and
// GOARM64=v8.0 run on every CPU of the architecture. No build tag is set,
// so imagectl uses the pure-Go gzip rather than cgo ISA-L.
func compile(ctx context.Context, o compileOptions) error {
	ldflags := fmt.Sprintf("-s -w -X %s.Version=%s -X %s.Commit=%s", versionPkg, o.version, versionPkg, o.revision)
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false", "-tags=",
		"-ldflags", ldflags, "-o", o.out, "./cmd/"+o.binary)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+o.arch,
		"GOFLAGS=", "GOAMD64=v1", "GOARM64=v8.0", "GOEXPERIMENT=")
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("building %s for linux/%s: %w\n%s", o.binary, o.arch, err, stderr.String())
	}
	return nil
}

// checkModuleRoot makes sure the builds run in imagepipe's module root.
func checkModuleRoot() error {
	mod, err := os.ReadFile("go.mod")
	if err != nil {
		return fmt.Errorf("reading go.mod (run imagebuild in the repository's root): %w", err)
	}
	if !bytes.HasPrefix(mod, []byte("module github.com/imagepipe/imagepipe\n")) {
		wd, _ := os.Getwd()
		return fmt.Errorf("%s is not imagepipe's module root", filepath.Clean(wd))
	}
	return nil
}

// gitOutput runs git with args and returns its trimmed output, or "" when
// git fails (no repository, no git).
func gitOutput(args ...string) string {
	out, err := exec.Command("git", args...).Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// sourceDateEpoch is $SOURCE_DATE_EPOCH, else the commit time of HEAD,
// else 0 (outside a repository).
func sourceDateEpoch() (int64, error) {
	s := os.Getenv("SOURCE_DATE_EPOCH")
	if s == "" {
		s = gitOutput("log", "-1", "--format=%ct")
	}
	if s == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("SOURCE_DATE_EPOCH %q is not a number of seconds since 1970", s)
	}
	return n, nil
}
