package hostile

import (
	"os"
	"testing"

	"github.com/imagepipe/imagepipe/test/testenv"
)

// TestMain builds imagectl and image-gate unless the Makefile built them.
func TestMain(m *testing.M) { os.Exit(testenv.MainWithGate(m)) }
