package source_test

import (
	"bytes"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/imagepipe/imagepipe/internal/reject"
	"github.com/imagepipe/imagepipe/internal/source"
)

// xzBytes compresses data with the xz program and extra arguments.
func xzBytes(t *testing.T, data []byte, args ...string) []byte {
	t.Helper()
	cmd := exec.Command("xz", append([]string{"-c"}, args...)...)
	cmd.Stdin = bytes.NewReader(data)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("xz: %v", err)
	}
	return out
}

// xzOutcome is what Open made of a source: its bytes and digest, or the
// rejection reason, or that it failed otherwise.
type xzOutcome struct {
	digest string
	data   []byte
	reason reject.Reason
	failed bool
}

func openOutcome(t *testing.T, spec string, opts source.Options) (xzOutcome, error) {
	t.Helper()
	tmp := t.TempDir()
	opts.TempDir = tmp
	img, err := source.Open(t.Context(), spec, opts)
	defer assertEmpty(t, tmp)
	if err != nil {
		if re := reject.As(err); re != nil {
			return xzOutcome{reason: re.Reason}, err
		}
		return xzOutcome{failed: true}, err
	}
	defer img.Close()
	return xzOutcome{digest: img.Digest, data: readAll(t, img)}, nil
}

// TestXZProgramAgreesWithGo: the xz program and the pure-Go decoder give
// the same image and digest for valid streams, and the same rejection for
// broken ones: truncated, corrupt, with garbage after the stream, nested,
// or expanding past the cap.
func TestXZProgramAgreesWithGo(t *testing.T) {
	program, err := exec.LookPath("xz")
	if err != nil {
		t.Skip("xz is not installed")
	}
	isolateCache(t)
	data := imageBytes(3<<20 + 11)
	whole := xzBytes(t, data)
	multiBlock := xzBytes(t, data, "-T2", "--block-size=1MiB")
	corrupt := bytes.Clone(whole)
	corrupt[len(corrupt)/2] ^= 0xff
	gz, err := exec.Command("sh", "-c", "head -c 100000 /dev/zero | gzip -c").Output()
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		in      []byte
		maxSize int64
		ok      bool
	}{
		{"whole", whole, 0, true},
		{"multi-block", multiBlock, 0, true},
		{"two streams", append(bytes.Clone(whole), whole...), 0, true},
		{"stream padding", append(bytes.Clone(whole), 0, 0, 0, 0), 0, true},
		{"truncated", whole[:len(whole)/2], 0, false},
		{"truncated before the index", whole[:len(whole)-40], 0, false},
		{"corrupt", corrupt, 0, false},
		{"garbage after", append(bytes.Clone(whole), "garbage!"...), 0, false},
		{"nested gzip", xzBytes(t, gz), 0, false},
		{"over the cap", whole, 1 << 20, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := writeFile(t, t.TempDir(), "disk.xz", tc.in)
			opts := source.Options{MaxSize: tc.maxSize}
			source.SetXZProgram(t, "")
			inGo, goErr := openOutcome(t, path, opts)
			source.SetXZProgram(t, program)
			viaProgram, progErr := openOutcome(t, path, opts)
			if tc.ok != (progErr == nil) || tc.ok != (goErr == nil) {
				t.Fatalf("want success %v; xz program: %v; Go: %v", tc.ok, progErr, goErr)
			}
			if viaProgram.reason != inGo.reason || viaProgram.failed != inGo.failed || viaProgram.digest != inGo.digest || !bytes.Equal(viaProgram.data, inGo.data) {
				t.Errorf("the xz program (%v) and Go (%v) disagree", progErr, goErr)
			}
			if !tc.ok && viaProgram.reason == "" {
				t.Errorf("the xz program's error is no rejection: %v", progErr)
			}
			if tc.ok && !bytes.Equal(viaProgram.data, data) && !strings.Contains(tc.name, "two streams") {
				t.Errorf("decoded %d bytes, want the original %d", len(viaProgram.data), len(data))
			}
		})
	}
	// A stream header and nothing else: the program says the input ends
	// early; the Go decoder gives an empty image, which the disk engine
	// rejects as empty.
	t.Run("header only", func(t *testing.T) {
		path := writeFile(t, t.TempDir(), "disk.xz", whole[:12])
		source.SetXZProgram(t, program)
		if out, err := openOutcome(t, path, source.Options{}); out.reason != reject.Wrapper {
			t.Errorf("the xz program: %v, want a %s rejection", err, reject.Wrapper)
		}
		source.SetXZProgram(t, "")
		if out, err := openOutcome(t, path, source.Options{}); err != nil || len(out.data) != 0 {
			t.Errorf("Go: %v, %d bytes; want an empty image", err, len(out.data))
		}
	})
	if testing.Verbose() {
		source.SetXZProgram(t, program)
		path := writeFile(t, t.TempDir(), "disk.xz", corrupt)
		_, err := source.Open(t.Context(), path, source.Options{})
		t.Logf("a corrupt stream: %v", err)
	}
}

// TestXZProgramMissingFallsBack: an xz program that cannot start leaves
// the stream to the Go decoder.
func TestXZProgramMissingFallsBack(t *testing.T) {
	if _, err := exec.LookPath("xz"); err != nil {
		t.Skip("xz is not installed")
	}
	isolateCache(t)
	data := imageBytes(1 << 20)
	path := writeFile(t, t.TempDir(), "disk.xz", xzBytes(t, data))
	source.SetXZProgram(t, "/nonexistent/xz")
	img := mustOpen(t, path, source.Options{})
	if got := readAll(t, img); !bytes.Equal(got, data) {
		t.Error("decoded bytes differ from the original")
	}
}

// TestXZProgramSourceFails: a download cut short under the xz program is a
// network failure, not a rejection of the image, and leaves nothing
// behind; so is one cut exactly after a complete stream, whose missing
// rest the program cannot see.
func TestXZProgramSourceFails(t *testing.T) {
	program, err := exec.LookPath("xz")
	if err != nil {
		t.Skip("xz is not installed")
	}
	source.SetXZProgram(t, program)
	data := imageBytes(2 << 20)
	whole := xzBytes(t, data)
	two := append(bytes.Clone(whole), whole...)
	for name, cut := range map[string]int{"mid-stream": len(whole) / 2, "after a whole stream": len(whole)} {
		t.Run(name, func(t *testing.T) {
			// No Accept-Ranges: the download cannot resume.
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Length", strconv.Itoa(len(two)))
				w.Write(two[:cut])
				panic(http.ErrAbortHandler) // the connection drops
			}))
			defer srv.Close()
			tmp := t.TempDir()
			_, err := source.Open(t.Context(), srv.URL+"/disk.xz", source.Options{TempDir: tmp})
			if err == nil || reject.As(err) != nil || !strings.Contains(err.Error(), "reading") {
				t.Errorf("err = %v, want a reading failure that is no rejection", err)
			}
			assertEmpty(t, tmp)
		})
	}
	if _, err := os.Stat(program); errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
}
