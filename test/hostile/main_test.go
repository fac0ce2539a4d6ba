package hostile

import (
	"os"
	"testing"

	"github.com/imagepipe/imagepipe/test/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }
