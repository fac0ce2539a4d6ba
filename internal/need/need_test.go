package need

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// skipCall is a call of one of testing's Skip methods.
var skipCall = regexp.MustCompile(`\.(Skip|Skipf|SkipNow)\(`)

// TestOnlyNeedSkips checks that no Go file of the module skips a test but
// through this package: a skip elsewhere would not say whether CI allows it.
// The demo's runner, which implements testing.TB, defines the methods.
func TestOnlyNeedSkips(t *testing.T) {
	root := filepath.Join("..", "..")
	allowedFiles := map[string]bool{
		filepath.Join("internal", "need", "need.go"): true,
		filepath.Join("test", "demo", "runner.go"):   true, // implements testing.TB
	}
	var found []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		if allowedFiles[rel] {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(data), "\n") {
			if skipCall.MatchString(line) && !strings.HasPrefix(strings.TrimSpace(line), "func (") {
				found = append(found, rel+":"+strconv.Itoa(i+1)+": "+strings.TrimSpace(line))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range found {
		t.Errorf("a skip outside package need (use need.Missing, need.Program, need.Root or need.Allow): %s", f)
	}
}

// recorder is a need.T that records a skip instead of ending the test.
type recorder struct{ msg string }

func (r *recorder) Helper()          {}
func (r *recorder) Skip(args ...any) { r.msg = args[0].(string) }

func TestOnlyAllowedReasonsAreAllowed(t *testing.T) {
	var r recorder
	OptIn(&r, "IMAGEPIPE_NEED_TEST_UNSET", "run it")
	if !IsAllowed(r.msg) {
		t.Errorf("an opt-in skip %q is not allowed", r.msg)
	}
	Missing(&r, "xz is not installed")
	if IsAllowed(r.msg) {
		t.Errorf("a missing program %q is allowed", r.msg)
	}
	for _, msg := range []string{"allowed skip (nope): x", "allowed skip (opt-in) x", "skip (opt-in): x"} {
		if IsAllowed(msg) {
			t.Errorf("%q is allowed", msg)
		}
	}
	t.Setenv("IMAGEPIPE_NEED_TEST_SET", "1")
	r.msg = ""
	OptIn(&r, "IMAGEPIPE_NEED_TEST_SET", "run it")
	if r.msg != "" {
		t.Errorf("an opt-in test skipped with its variable set: %q", r.msg)
	}
}

// TestToolsInstallEveryProgram checks that test/tools.sh, which make test
// runs first, installs the Debian package of every program tests run.
func TestToolsInstallEveryProgram(t *testing.T) {
	script, err := os.ReadFile(filepath.Join("..", "..", "test", "tools.sh"))
	if err != nil {
		t.Fatal(err)
	}
	for program, pkg := range Programs {
		if !strings.Contains(string(script), "need+=("+pkg+")") {
			t.Errorf("test/tools.sh does not install %s, the package of %s", pkg, program)
		}
	}
}
