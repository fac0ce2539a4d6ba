package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// runFixture runs `go test -json` on testdata/fixture with env and returns
// testreport's verdict and output.
func runFixture(t *testing.T, env ...string) (bool, string) {
	t.Helper()
	cmd := exec.Command("go", "test", "-count=1", "-json", ".")
	cmd.Dir = filepath.Join("testdata", "fixture")
	cmd.Env = append(os.Environ(), env...)
	out, _ := cmd.CombinedOutput() // failing tests are the point; the report judges
	var b bytes.Buffer
	r := &report{out: &b, outputs: map[string][]string{}}
	if err := r.read(bytes.NewReader(out)); err != nil {
		t.Fatal(err)
	}
	ok := r.summary()
	return ok, b.String()
}

func TestAllowedSkipsPass(t *testing.T) {
	ok, out := runFixture(t)
	if !ok {
		t.Fatalf("a run with only an allowed skip failed:\n%s", out)
	}
	if !strings.Contains(out, "allowed     example.com/fixture.TestOptIn: allowed skip (opt-in): set X=1 to run it") {
		t.Errorf("the allowed skip is not listed:\n%s", out)
	}
	if !strings.Contains(out, "ok  \texample.com/fixture") {
		t.Errorf("the package's result is not printed:\n%s", out)
	}
}

func TestMissingToolFails(t *testing.T) {
	ok, out := runFixture(t, "FIXTURE_MISSING=1")
	if ok {
		t.Fatalf("a run that skipped for a missing tool passed:\n%s", out)
	}
	if !strings.Contains(out, "NOT ALLOWED example.com/fixture.TestMissing: missing: xz is not installed") {
		t.Errorf("the skip is not named:\n%s", out)
	}
}

func TestFailedTestFailsWithItsOutput(t *testing.T) {
	ok, out := runFixture(t, "FIXTURE_FAIL=1")
	if ok {
		t.Fatalf("a failing run passed:\n%s", out)
	}
	if !strings.Contains(out, ": boom") || !strings.Contains(out, "--- FAIL: TestFail/sub") {
		t.Errorf("the failure's output is not printed:\n%s", out)
	}
}

// A failure buried under later output is repeated just before the test's
// "--- FAIL" line, where a CI summary that shows only a few lines finds it.
func TestFailureIsRepeatedBeforeItsFailLine(t *testing.T) {
	_, out := runFixture(t, "FIXTURE_FAIL=1")
	lines := strings.Split(out, "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, "--- FAIL: TestNoisy") {
			if i == 0 || !strings.Contains(lines[i-1], "fixture_test.go") || !strings.Contains(lines[i-1], "boom under noise") {
				t.Errorf("the line before %q is %q, want the test's error:\n%s", l, lines[max(i-1, 0)], out)
			}
			return
		}
	}
	t.Errorf("no --- FAIL: TestNoisy line:\n%s", out)
}

func TestNoResultFails(t *testing.T) {
	var b bytes.Buffer
	r := &report{out: &b, outputs: map[string][]string{}}
	if err := r.read(strings.NewReader("go: cannot find main module\n")); err != nil {
		t.Fatal(err)
	}
	if r.summary() {
		t.Errorf("a run where no package reported passed:\n%s", b.String())
	}
	if !strings.Contains(b.String(), "go: cannot find main module") {
		t.Errorf("the go command's message is not printed:\n%s", b.String())
	}
}
