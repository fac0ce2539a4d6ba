package convert

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/imagepipe/imagepipe/internal/need"
)

// The fuzz invariants of checkImage compare imagepipe's writer with
// imagepipe's reader, so a writer bug the reader shares (an L2 entry
// without the COPIED flag, a refcount off by one) passes all of them. This
// file holds the writer's output against qemu-img: TestFuzzCorpusAgainstQEMU
// for the seed corpora on every go test run, and the fuzz targets
// themselves when IMAGEPIPE_FUZZ_QEMU is set.

// fuzzQEMUEnv makes the fuzz targets that write check each output with
// QEMU too: IMAGEPIPE_FUZZ_QEMU=1 go test -fuzz FuzzOpen. Each accepted
// input then costs about 18 runs of qemu-img and qemu-io, a quarter of a
// second, so fuzzing is far slower; the default fuzz run leaves it off.
const fuzzQEMUEnv = "IMAGEPIPE_FUZZ_QEMU"

// qemuTools are the paths of the QEMU programs checkWithQEMU runs.
type qemuTools struct{ img, io string }

// fuzzQEMU is the QEMU the fuzz targets run, found once per process: nil
// when fuzzQEMUEnv is unset.
var fuzzQEMU = sync.OnceValues(func() (*qemuTools, error) {
	if os.Getenv(fuzzQEMUEnv) == "" {
		return nil, nil
	}
	var q qemuTools
	for _, p := range []struct {
		name string
		path *string
	}{{"qemu-img", &q.img}, {"qemu-io", &q.io}} {
		path, err := exec.LookPath(p.name)
		if err != nil {
			return nil, fmt.Errorf("%s is set, but %s is not installed: %w", fuzzQEMUEnv, p.name, err)
		}
		*p.path = path
	}
	return &q, nil
})

// fuzzCheck is the body of the fuzz targets that write: checkImage and,
// with fuzzQEMUEnv set, QEMU's verdict on what it wrote.
func fuzzCheck(t *testing.T, data []byte) {
	c := checkImage(t, data)
	q, err := fuzzQEMU()
	if err != nil {
		t.Fatal(err) // asked for by name: a missing program is no skip
	}
	if c != nil && q != nil {
		checkWithQEMU(t, q, c)
	}
}

// converted is what checkImage wrote for an image it accepted.
type converted struct {
	input  []byte
	format Format // the input's
	qcow2  []byte // Plan and Write, fuzzOptions
	file   []byte // WriteFile, fuzzOptions
	raw    []byte // Plan and Write to raw; nil when refused as ambiguous
}

// qemuClusterSize is the output cluster size checkWithQEMU writes with
// besides fuzzOptions': at 4 KiB every fuzz image fits one L2 table and one
// refcount block, at 512 bytes a 1 MiB disk needs 32 L2 tables and 9
// refcount blocks, so the writer's L1 and refcount table layout is checked
// too.
const qemuClusterSize = 512

// checkWithQEMU holds what the writer made of c.input against QEMU:
//
//   - each qcow2 output (checkImage's, and one of each layout at
//     qemuClusterSize) passes qemu-img check with no corruption, leak or
//     check error;
//   - and still does once QEMU has written the whole disk through it
//     (qemu-io), as a VM does: a refcount on a cluster past the end of the
//     file, harmless to check, then becomes a leak, and refcounts or flags
//     QEMU trusts when it allocates or overwrites in place are put to use;
//   - every output, raw included, reads as the same disk as the input
//     read by qemu-img itself (qemu-img convert to raw, then qemu-img
//     compare, which also fails on a size mismatch).
//
// The input is compared as qemu-img reads it, not as imagepipe does: the
// reader is the code under suspicion as much as the writer (raw output and
// the qcow2 read-back agree whenever both are wrong the same way), and an
// image imagepipe accepts is one QEMU reads through the same tables
// (refcounts, which imagepipe never reads, do not matter to qemu-img's
// read-only open). An accepted input that qemu-img cannot read is a
// verdict that disagrees with QEMU's, and fails as such before any output
// is looked at.
func checkWithQEMU(t *testing.T, q *qemuTools, c *converted) {
	t.Helper()
	dir := t.TempDir()
	save := func(name string, b []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	input := save("input", c.input)
	disk := filepath.Join(dir, "input.qemu.raw")
	if out, err := exec.Command(q.img, "convert", "-f", string(c.format), "-O", "raw", input, disk).CombinedOutput(); err != nil {
		t.Fatalf("imagepipe accepts this %s image, qemu-img cannot read it (a verdict that disagrees with QEMU's, not a writer fault): %v\n%s", c.format, err, out)
	}
	type output struct {
		path   string
		format Format
	}
	outputs := []output{
		{save("stream.qcow2", c.qcow2), FormatQCOW2},
		{save("file.qcow2", c.file), FormatQCOW2},
	}
	if c.raw != nil {
		outputs = append(outputs, output{save("out.raw", c.raw), FormatRaw})
	}
	// The same input again at qemuClusterSize, in both layouts.
	opts := fuzzOptions
	opts.ClusterSize = qemuClusterSize
	img, _, err := openBytes(t, c.input, OpenOptions{MaxVirtualSize: fuzzMaxVirtual})
	if err != nil {
		t.Fatalf("reopening an accepted input: %v", err)
	}
	outputs = append(outputs, output{save("small-stream.qcow2", convertChecked(t, img, nil, opts, 0)), FormatQCOW2})
	f, err := os.Create(filepath.Join(dir, "small-file.qcow2"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := img.WriteFile(context.Background(), f, opts); err != nil {
		t.Fatalf("WriteFile at %d-byte clusters: %v", qemuClusterSize, err)
	}
	outputs = append(outputs, output{f.Name(), FormatQCOW2})

	for _, o := range outputs {
		qemuCompare(t, q.img, disk, o.path, o.format)
		if o.format != FormatQCOW2 {
			continue
		}
		qemuCheck(t, q.img, o.path)
		written := o.path + ".written"
		b, err := os.ReadFile(o.path)
		if err == nil {
			err = os.WriteFile(written, b, 0o600)
		}
		if err != nil {
			t.Fatal(err)
		}
		write := fmt.Sprintf("write -P 0x77 0 %d", img.qcow2VirtualSize())
		if out, err := exec.Command(q.io, "-f", "qcow2", "-c", write, written).CombinedOutput(); err != nil {
			t.Errorf("qemu-io %q on %s: %v\n%s", write, filepath.Base(o.path), err, out)
			continue
		}
		qemuCheck(t, q.img, written)
	}
}

// qemuCheckResult is the part of `qemu-img check --output=json` that
// judges an image; qemu-img leaves out the counts that are zero.
type qemuCheckResult struct {
	CheckErrors int `json:"check-errors"`
	Corruptions int `json:"corruptions"`
	Leaks       int `json:"leaks"`
}

// qemuCheck fails unless qemu-img check finds the qcow2 file at path
// clean: exit status 0, no check errors, corruptions or leaks.
func qemuCheck(t *testing.T, qemuImg, path string) {
	t.Helper()
	cmd := exec.Command(qemuImg, "check", "-f", "qcow2", "--output=json", path)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var res qemuCheckResult
	if jerr := json.Unmarshal(out, &res); jerr != nil || err != nil || res != (qemuCheckResult{}) {
		// Run it again for the human-readable list of what is wrong.
		text, _ := exec.Command(qemuImg, "check", "-f", "qcow2", path).CombinedOutput()
		lines := strings.SplitAfter(string(text), "\n")
		if len(lines) > 12 {
			lines = append(lines[:10], "...\n", lines[len(lines)-1])
		}
		t.Errorf("qemu-img check %s: %v (%+v)\n%s%s", filepath.Base(path), err, res, stderr.Bytes(), strings.Join(lines, ""))
	}
}

// qemuCompare fails unless qemu-img reads the output at path (of format
// f) as the raw disk at disk, of the same size.
func qemuCompare(t *testing.T, qemuImg, disk, path string, f Format) {
	t.Helper()
	out, err := exec.Command(qemuImg, "compare", "-f", "raw", "-F", string(f), disk, path).CombinedOutput()
	if err != nil || bytes.Contains(out, []byte("mismatch")) {
		t.Errorf("qemu-img compare of the input with %s: %v\n%s", filepath.Base(path), err, out)
	}
}

// writerTarget is a fuzz target whose inputs go through checkImage, and so
// through imagepipe's writer.
type writerTarget struct {
	name string
	// seeds are the target's f.Add arguments.
	seeds func(tb testing.TB) [][]any
	// image is the image the target builds from its arguments; false for
	// arguments it skips.
	image func(args []any) ([]byte, bool)
}

var writerTargets = []writerTarget{
	{
		name: "FuzzOpen",
		seeds: func(tb testing.TB) (s [][]any) {
			for _, b := range validSeeds(tb) {
				s = append(s, []any{b})
			}
			return s
		},
		image: func(a []any) ([]byte, bool) { return a[0].([]byte), true },
	},
	{
		name: "FuzzL2Table",
		seeds: func(tb testing.TB) (s [][]any) {
			for _, l := range l2Seeds(tb) {
				s = append(s, []any{l.l2, l.comp, l.zstd})
			}
			return s
		},
		image: func(a []any) ([]byte, bool) { return l2TableImage(a[0].([]byte), a[1].([]byte), a[2].(bool)) },
	},
	{
		name: "FuzzTableSharing",
		seeds: func(tb testing.TB) (s [][]any) {
			for _, x := range sharingSeeds(tb) {
				s = append(s, []any{x.l1, x.l2, x.recipe, x.zstd})
			}
			return s
		},
		image: func(a []any) ([]byte, bool) {
			return sharingInput(a[0].([]byte), a[1].([]byte), a[2].([]byte), a[3].(bool))
		},
	},
}

// qemuCorpusLimit bounds the accepted inputs per target that
// TestFuzzCorpusAgainstQEMU hands to QEMU (a quarter of a second each on
// one core), so that a growing corpus keeps the test to seconds.
const qemuCorpusLimit = 40

// TestFuzzCorpusAgainstQEMU runs every input of the writing fuzz targets'
// seed corpora (their f.Add seeds and testdata/fuzz/<target>) through
// checkImage and holds what the writer made of each accepted one against
// qemu-img (checkWithQEMU). Past qemuCorpusLimit accepted inputs in a
// target, it takes that many spread evenly over them in name order (f.Add
// seeds first): the choice is the same on every run.
func TestFuzzCorpusAgainstQEMU(t *testing.T) {
	q := &qemuTools{img: need.Program(t, "qemu-img"), io: need.Program(t, "qemu-io")}
	for _, target := range writerTargets {
		t.Run(target.name, func(t *testing.T) {
			inputs := corpusInputs(t, target)
			var accepted []corpusInput
			ran := 0 // fewer than the inputs under -run
			t.Run("checkImage", func(t *testing.T) {
				for _, in := range inputs {
					t.Run(in.name, func(t *testing.T) {
						ran++
						if c := checkImage(t, in.image); c != nil {
							accepted = append(accepted, corpusInput{in.name, in.image, c})
						}
					})
				}
			})
			if len(accepted) == 0 && ran == len(inputs) {
				t.Fatalf("none of the %d inputs is accepted: nothing reaches the writer", len(inputs))
			}
			chosen := spread(accepted, qemuCorpusLimit)
			t.Logf("%d inputs, %d accepted, %d checked with qemu-img", len(inputs), len(accepted), len(chosen))
			t.Run("qemu-img", func(t *testing.T) {
				for _, in := range chosen {
					t.Run(in.name, func(t *testing.T) {
						t.Parallel()
						checkWithQEMU(t, q, in.out)
					})
				}
			})
		})
	}
}

// spread returns at most n of s, evenly spaced, in order.
func spread[E any](s []E, n int) []E {
	if len(s) <= n {
		return s
	}
	out := make([]E, n)
	for i := range out {
		out[i] = s[i*len(s)/n]
	}
	return out
}

type corpusInput struct {
	name  string
	image []byte
	out   *converted
}

// corpusInputs returns the images of target's f.Add seeds ("seed#N") and
// of the files in testdata/fuzz/<target> (by file name, sorted), leaving
// out those the target skips and repeats of an earlier image. A corpus
// file the target could not read fails the test.
func corpusInputs(t *testing.T, target writerTarget) []corpusInput {
	t.Helper()
	seeds := target.seeds(t)
	if len(seeds) == 0 {
		t.Fatalf("%s has no f.Add seeds", target.name)
	}
	var types []reflect.Type
	for _, v := range seeds[0] {
		types = append(types, reflect.TypeOf(v))
	}
	var inputs []corpusInput
	seen := map[string]bool{} // testdata often repeats the f.Add seeds
	add := func(name string, args []any) {
		if img, ok := target.image(args); ok && !seen[string(img)] {
			seen[string(img)] = true
			inputs = append(inputs, corpusInput{name: name, image: img})
		}
	}
	for i, args := range seeds {
		add(fmt.Sprintf("seed#%d", i), args)
	}
	dir := filepath.Join("testdata", "fuzz", target.name)
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	for _, e := range entries {
		path := filepath.Join(dir, e.Name())
		args, err := readCorpusFile(path)
		if err != nil {
			t.Fatalf("reading %s: %v", path, err)
		}
		got := make([]reflect.Type, len(args))
		for i, v := range args {
			got[i] = reflect.TypeOf(v)
		}
		if !slices.Equal(got, types) {
			t.Fatalf("%s holds %v, %s takes %v", path, got, target.name, types)
		}
		add(e.Name(), args)
	}
	return inputs
}

// readCorpusFile reads a file in the format of go test -fuzz's corpus
// ("go test fuzz v1", then one Go literal a line), as far as the targets of
// this package use it: []byte, bool and int64 values.
func readCorpusFile(path string) ([]any, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) == 0 || lines[0] != "go test fuzz v1" {
		return nil, errors.New("not a go test fuzz v1 file")
	}
	var args []any
	for _, line := range lines[1:] {
		v, err := corpusValue(line)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", line, err)
		}
		args = append(args, v)
	}
	return args, nil
}

func corpusValue(line string) (any, error) {
	expr, err := parser.ParseExpr(line)
	if err != nil {
		return nil, err
	}
	call, ok := expr.(*ast.CallExpr)
	if !ok || len(call.Args) != 1 {
		return nil, errors.New("not a conversion of one value")
	}
	arg := call.Args[0]
	switch fn := call.Fun.(type) {
	case *ast.ArrayType:
		lit, ok := arg.(*ast.BasicLit)
		if elt, isIdent := fn.Elt.(*ast.Ident); !isIdent || elt.Name != "byte" || fn.Len != nil || !ok || lit.Kind != token.STRING {
			return nil, errors.New("not a []byte string literal")
		}
		s, err := strconv.Unquote(lit.Value)
		return []byte(s), err
	case *ast.Ident:
		switch fn.Name {
		case "bool":
			if id, ok := arg.(*ast.Ident); ok && (id.Name == "true" || id.Name == "false") {
				return id.Name == "true", nil
			}
		case "int64":
			text := ""
			if u, ok := arg.(*ast.UnaryExpr); ok && u.Op == token.SUB {
				text, arg = "-", u.X
			}
			if lit, ok := arg.(*ast.BasicLit); ok && lit.Kind == token.INT {
				return strconv.ParseInt(text+lit.Value, 0, 64)
			}
		}
	}
	return nil, errors.New("not a []byte, bool or int64 value")
}
