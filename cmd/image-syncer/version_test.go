package main

import (
	"bytes"
	"testing"

	"github.com/imagepipe/imagepipe/internal/version"
)

// TestVersionFlag: --version prints the build, as version.Get says it, and
// needs none of the flags a run needs.
func TestVersionFlag(t *testing.T) {
	for _, arg := range []string{"--version", "-v"} {
		cmd := newRootCmd()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetArgs([]string{arg})
		if err := cmd.Execute(); err != nil {
			t.Fatalf("%s: %v", arg, err)
		}
		if want := "image-syncer version " + version.Get().String() + "\n"; out.String() != want {
			t.Errorf("%s printed %q, want %q", arg, out.String(), want)
		}
	}
}
