package convert

import (
	"flag"
	"os"
	"testing"
)

// fuzzMinimizeDefault bounds how long the fuzzer minimises each new
// interesting input unless -fuzzminimizetime says otherwise. Go's
// minimiser tries time quadratic in an input's length, and by default for
// up to a minute per input: a 10-second run that finds a whole image
// interesting spends it minimising instead of fuzzing. A thousand tries
// still shrink an input, in tens of milliseconds.
const fuzzMinimizeDefault = "1000x"

// fuzzMinimizeQEMU is the default with fuzzQEMUEnv set, when each try of
// an accepted input runs QEMU for a quarter of a second: a thousand tries
// would stall the fuzzer for minutes on every new input.
const fuzzMinimizeQEMU = "50x"

func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.fuzzminimizetime" })
	if !set {
		limit := fuzzMinimizeDefault
		if os.Getenv(fuzzQEMUEnv) != "" {
			limit = fuzzMinimizeQEMU
		}
		if err := flag.Set("test.fuzzminimizetime", limit); err != nil {
			panic(err) // the flag is testing's own: cannot fail
		}
	}
	os.Exit(m.Run())
}
