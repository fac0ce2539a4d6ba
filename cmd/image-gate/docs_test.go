package main

import (
	"testing"

	"github.com/imagepipe/imagepipe/internal/clidoc"
)

// cliDocsDir holds the generated CLI reference, relative to this package.
const cliDocsDir = "../../docs/cli"

// TestCLIReferenceIsCurrent renders the Markdown reference of image-gate
// and compares it with docs/cli, so that the reference cannot fall behind
// the flags. With UPDATE_DOCS=1 (make docs) it rewrites the files instead.
func TestCLIReferenceIsCurrent(t *testing.T) {
	clidoc.Check(t, newRootCmd(), cliDocsDir)
}
