package guest

import (
	"os"
	"testing"

	"github.com/imagepipe/imagepipe/test/testenv"
)

// TestMain gives the tests the imagectl and image-gate binaries under
// test ($IMAGECTL and $IMAGE_GATE, else fresh builds).
func TestMain(m *testing.M) { os.Exit(testenv.MainWithGate(m)) }
