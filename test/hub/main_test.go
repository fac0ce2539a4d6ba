package hub

import (
	"os"
	"testing"

	"github.com/imagepipe/imagepipe/test/testenv"
)

// TestMain gives the tests the imagectl binary under test ($IMAGECTL, else
// a fresh build), for the tests that run it as a tenant would.
func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }
