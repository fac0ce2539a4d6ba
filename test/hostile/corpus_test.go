package hostile

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/imagepipe/imagepipe/test/testenv"

	"github.com/imagepipe/imagepipe/internal/need"
)

// seedSize is how much of each image becomes a fuzz seed: the header and its extensions,
// which is what the header-level checks look at, without bloating the repository with
// whole images. Trailing zeros are dropped too.
const seedSize = 16 << 10

// TestWriteFuzzSeeds regenerates the FuzzOpen seed corpus of internal/convert from the
// hostile corpus (and its valid controls, which give the fuzzer well-formed structure to
// mutate). It only runs with IMAGEPIPE_WRITE_SEEDS=1, since it writes into the source tree.
func TestWriteFuzzSeeds(t *testing.T) {
	need.OptIn(t, "IMAGEPIPE_WRITE_SEEDS", "rewrite internal/convert/testdata/fuzz/FuzzOpen")
	testenv.RequireQEMU(t)
	// go test runs a test in its package directory, so this is relative to test/hostile.
	dir := filepath.Join("..", "..", "internal", "convert", "testdata", "fuzz", "FuzzOpen")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range corpus {
		t.Run(tc.name, func(t *testing.T) {
			head := readHead(t, tc.build(t, t.TempDir()))
			// The format `go test -fuzz` itself writes for a func(*testing.T, []byte) target.
			seed := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", head)
			name := "hostile-" + strings.ReplaceAll(tc.name, "/", "-")
			if err := os.WriteFile(filepath.Join(dir, name), []byte(seed), 0o644); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// readHead returns the first seedSize bytes of the file (all of it when shorter).
func readHead(t *testing.T, path string) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, seedSize))
	if err != nil {
		t.Fatal(err)
	}
	return bytes.TrimRight(b, "\x00")
}
