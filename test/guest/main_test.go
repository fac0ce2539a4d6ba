package guest

import (
	"os"
	"testing"

	"github.com/imagepipe/imagepipe/test/testenv"
)

// TestMain gives the tests the imagectl binary under test ($IMAGECTL, else
// a fresh build).
func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }
