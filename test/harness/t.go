package harness

import "context"

// T is what the harness needs of a test: the part of T it calls.
// *testing.T and *testing.B implement it, and so does the demo's runner
// (test/demo), which drives the harness outside go test.
type T interface {
	Helper()
	Name() string
	Context() context.Context
	Cleanup(func())
	TempDir() string
	Log(args ...any)
	Logf(format string, args ...any)
	Error(args ...any)
	Errorf(format string, args ...any)
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Failed() bool
	Skip(args ...any)
}
