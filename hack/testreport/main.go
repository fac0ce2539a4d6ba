// Command testreport reads `go test -json` on standard input and prints
// what plain `go test` would (each package's result, the output of failed
// tests), then every skipped test with its reason. It exits 1 when a test or
// a build failed, when no package reported, or when a test skipped for a
// reason outside need.Allowed: under `make test` and CI a missing tool,
// privilege or server fails the run instead of passing as a skip.
//
//	go test -json ./... 2>&1 | go run ./hack/testreport
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/imagepipe/imagepipe/internal/need"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action     string
	Package    string
	ImportPath string // build-output and build-fail
	Test       string
	Output     string
}

// skip is one skipped test and its reason.
type skip struct {
	test, reason string
	allowed      bool
}

type report struct {
	out      io.Writer
	outputs  map[string][]string // output of each running test, by package and test
	skips    []skip
	packages int
	failed   bool
}

func main() {
	r := &report{out: os.Stdout, outputs: map[string][]string{}}
	if err := r.read(os.Stdin); err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
		os.Exit(1)
	}
	if !r.summary() {
		os.Exit(1)
	}
}

// read handles each line of in; lines that are not JSON (the go command's
// own messages) are printed as they are.
func (r *report) read(in io.Reader) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var e event
		if line := sc.Bytes(); len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			fmt.Fprintln(r.out, sc.Text())
			continue
		}
		r.handle(e)
	}
	return sc.Err()
}

func (r *report) handle(e event) {
	key := e.Package + " " + e.Test
	switch {
	case e.Action == "build-output":
		fmt.Fprint(r.out, e.Output)
	case e.Action == "build-fail":
		r.failed = true
	case e.Test == "" && e.Action == "output":
		if s := strings.TrimSpace(e.Output); s != "PASS" && s != "FAIL" && !strings.HasPrefix(s, "=== ") {
			fmt.Fprint(r.out, e.Output)
		}
	case e.Test == "" && (e.Action == "pass" || e.Action == "fail"):
		r.packages++
		if e.Action == "fail" {
			r.failed = true
			r.flushUnfinished(e.Package) // a panic or a timeout ended the test binary
		}
	case e.Test == "":
	case e.Action == "output":
		r.outputs[key] = append(r.outputs[key], e.Output)
	case e.Action == "fail":
		r.failed = true
		fmt.Fprint(r.out, strings.Join(withRecap(r.outputs[key]), ""))
		delete(r.outputs, key)
	case e.Action == "skip":
		reason, allowed := skipReason(r.outputs[key])
		r.skips = append(r.skips, skip{test: e.Package + "." + e.Test, reason: reason, allowed: allowed})
		delete(r.outputs, key)
	case e.Action == "pass":
		delete(r.outputs, key)
	}
}

// maxRecap bounds the lines withRecap repeats.
const maxRecap = 12

// testLine matches a line a test file logged or failed with
// ("    name_test.go:12: message").
var testLine = regexp.MustCompile(`^\s+\S+_test\.go:\d+: `)

// withRecap returns a failed test's output with the last lines its test
// files logged (its t.Error lines among them) repeated just before its
// "--- FAIL" line: the logs of the servers a test ran, printed when they
// stop, can bury the failure, and a CI summary shows only the lines just
// before "--- FAIL".
func withRecap(lines []string) []string {
	end := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(strings.TrimSpace(l), "--- FAIL") })
	if end < 0 {
		return lines
	}
	var recap []string
	for _, l := range lines[:end] {
		if testLine.MatchString(l) {
			recap = append(recap, l)
		}
	}
	if len(recap) == 0 || slices.Equal(recap, lines[end-len(recap):end]) {
		return lines
	}
	recap = recap[max(len(recap)-maxRecap, 0):]
	return slices.Concat(lines[:end], []string{"    (the test's own last lines, repeated:)\n"}, recap, lines[end:])
}

// flushUnfinished prints the output of pkg's tests that never ended.
func (r *report) flushUnfinished(pkg string) {
	var keys []string
	for k := range r.outputs {
		if strings.HasPrefix(k, pkg+" ") {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprint(r.out, strings.Join(r.outputs[k], ""))
		delete(r.outputs, k)
	}
}

// skipReason finds the skip message in a skipped test's output: the log
// line "file.go:12: message" before or after "--- SKIP".
func skipReason(lines []string) (string, bool) {
	reason := ""
	for _, line := range lines {
		s := strings.TrimSpace(line)
		if s == "" || strings.HasPrefix(s, "=== ") || strings.HasPrefix(s, "--- SKIP") {
			continue
		}
		if _, msg, ok := strings.Cut(s, ": "); ok && strings.Contains(s[:len(s)-len(msg)], ".go:") {
			s = msg
		}
		if need.IsAllowed(s) {
			return s, true
		}
		if reason == "" {
			reason = s
		}
	}
	if reason == "" {
		reason = "(no reason given)"
	}
	return reason, false
}

// summary prints the skips and the verdict, and reports whether the run
// passed.
func (r *report) summary() bool {
	ok := !r.failed && r.packages > 0
	fmt.Fprintf(r.out, "\npackages: %d, skipped tests: %d; a test may skip only as %s\n", r.packages, len(r.skips), allowedKeys())
	if len(r.skips) > 0 {
		for _, s := range r.skips {
			mark := "allowed"
			if !s.allowed {
				mark, ok = "NOT ALLOWED", false
			}
			fmt.Fprintf(r.out, "  %-11s %s: %s\n", mark, s.test, s.reason)
		}
	}
	switch {
	case r.packages == 0:
		fmt.Fprintln(r.out, "FAIL: no package reported a result")
	case !ok:
		fmt.Fprintln(r.out, "FAIL")
	}
	return ok
}

// allowedKeys lists need.Allowed, each key with its reason.
func allowedKeys() string {
	keys := make([]string, 0, len(need.Allowed))
	for k := range need.Allowed {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for i, k := range keys {
		keys[i] = k + " (" + need.Allowed[k] + ")"
	}
	return strings.Join(keys, "; ")
}
