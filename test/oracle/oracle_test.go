package oracle

import (
	"bytes"
	"encoding/json"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"github.com/ulikunitz/xz"

	"github.com/imagepipe/imagepipe/pkg/api"
	"github.com/imagepipe/imagepipe/test/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// run runs a command and fails the test if it does not exit 0.
var run = testenv.Run

// writeRaw makes a sparse raw image of size bytes holding random data,
// a repeating pattern, allocated all-zero blocks and holes.
func writeRaw(t *testing.T, path string, size int64, seed uint64) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	put := func(off int64, b []byte) {
		if off+int64(len(b)) > size {
			b = b[:size-off]
		}
		if _, err := f.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
	}
	random := make([]byte, 700<<10)
	for i := range random {
		random[i] = byte(rng.Uint32())
	}
	pattern := bytes.Repeat([]byte("imagepipe-"), 30000)
	zeros := make([]byte, 256<<10)
	put(0, random[:4096])                   // a boot sector and more
	put(1<<20+123, random)                  // unaligned random data
	put(3<<20, pattern)                     // compressible data
	put(5<<20, zeros)                       // allocated but all zero
	put(6<<20-512, random[:1024])           // straddles a cluster boundary
	put(size-3000, random[:3000])           // the very end
	put(size/2&^4095, pattern[:100<<10])    // middle
	put(size/3&^511+17, random[:64<<10])    // odd offset
	put(size/4&^65535, zeros[:128<<10])     // another zero run
	put(size/4&^65535+(128<<10), []byte{1}) // one byte after it
}

// info is the part of `qemu-img info --output=json` we compare.
type info struct {
	Format         string `json:"format"`
	VirtualSize    int64  `json:"virtual-size"`
	ClusterSize    int64  `json:"cluster-size"`
	FormatSpecific struct {
		Data struct {
			Compat          string `json:"compat"`
			CompressionType string `json:"compression-type"`
		} `json:"data"`
	} `json:"format-specific"`
}

func qemuInfo(t *testing.T, path string) info {
	t.Helper()
	var i info
	if err := json.Unmarshal(run(t, "qemu-img", "info", "--output=json", path), &i); err != nil {
		t.Fatal(err)
	}
	return i
}

// qemuAllocated is the number of guest bytes qemu-img map reports as data.
func qemuAllocated(t *testing.T, path, format string) int64 {
	t.Helper()
	var extents []struct {
		Length int64 `json:"length"`
		Data   bool  `json:"data"`
	}
	if err := json.Unmarshal(run(t, "qemu-img", "map", "-f", format, "--output=json", path), &extents); err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, e := range extents {
		if e.Data {
			n += e.Length
		}
	}
	return n
}

func inspect(t *testing.T, path string) api.ImageReport {
	t.Helper()
	var r api.ImageReport
	if err := json.Unmarshal(run(t, testenv.Imagectl, "inspect", "-o", "json", path), &r); err != nil {
		t.Fatal(err)
	}
	return r
}

// corpusCase builds one image in dir and returns its path.
type corpusCase struct {
	name  string
	build func(t *testing.T, dir string) string
}

func rawImage(size int64) func(*testing.T, string) string {
	return func(t *testing.T, dir string) string {
		p := filepath.Join(dir, "disk.raw")
		writeRaw(t, p, size, uint64(size))
		return p
	}
}

// qcow2From converts a generated raw image with qemu-img convert and opts.
func qcow2From(size int64, opts ...string) func(*testing.T, string) string {
	return func(t *testing.T, dir string) string {
		raw := rawImage(size)(t, dir)
		p := filepath.Join(dir, "disk.qcow2")
		run(t, "qemu-img", append(append([]string{"convert", "-O", "qcow2"}, opts...), raw, p)...)
		return p
	}
}

// qcow2Written creates an empty qcow2 with createOpts and applies qemu-io
// commands to it: allocation patterns that conversion cannot produce.
func qcow2Written(size string, createOpts string, ioCmds ...string) func(*testing.T, string) string {
	return func(t *testing.T, dir string) string {
		p := filepath.Join(dir, "disk.qcow2")
		args := []string{"create", "-q", "-f", "qcow2"}
		if createOpts != "" {
			args = append(args, "-o", createOpts)
		}
		run(t, "qemu-img", append(args, p, size)...)
		if len(ioCmds) > 0 {
			io := []string{"-f", "qcow2"}
			for _, c := range ioCmds {
				io = append(io, "-c", c)
			}
			run(t, "qemu-io", append(io, p)...)
		}
		return p
	}
}

// wrapped compresses the image another case builds.
func wrapped(kind string, inner func(*testing.T, string) string) func(*testing.T, string) string {
	return func(t *testing.T, dir string) string {
		src := inner(t, dir)
		p := src + "." + kind
		in, err := os.Open(src)
		if err != nil {
			t.Fatal(err)
		}
		defer in.Close()
		out, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		defer out.Close()
		var w io.WriteCloser
		switch kind {
		case "gz":
			w = gzip.NewWriter(out)
		case "zst":
			w, err = zstd.NewWriter(out)
		case "xz":
			w, err = xz.NewWriter(out)
		}
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(w, in); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		return p
	}
}

var corpus = []corpusCase{
	{"raw-sparse", rawImage(24 << 20)},
	{"raw-odd-size", rawImage(7<<20 + 1234)},
	{"qcow2-v3-64k", qcow2From(24<<20, "-o", "compat=1.1")},
	{"qcow2-v3-512", qcow2From(6<<20, "-o", "compat=1.1,cluster_size=512")},
	{"qcow2-v3-4k", qcow2From(24<<20, "-o", "cluster_size=4096")},
	{"qcow2-v3-2m", qcow2From(24<<20, "-o", "cluster_size=2097152")},
	{"qcow2-v2-64k", qcow2From(24<<20, "-o", "compat=0.10")},
	{"qcow2-v2-512", qcow2From(6<<20, "-o", "compat=0.10,cluster_size=512")},
	{"qcow2-zlib-64k", qcow2From(24<<20, "-c", "-o", "compression_type=zlib")},
	{"qcow2-zlib-4k", qcow2From(24<<20, "-c", "-o", "cluster_size=4096")},
	{"qcow2-zlib-v2", qcow2From(24<<20, "-c", "-o", "compat=0.10")},
	{"qcow2-zstd-64k", qcow2From(24<<20, "-c", "-o", "compression_type=zstd")},
	{"qcow2-zstd-2m", qcow2From(24<<20, "-c", "-o", "compression_type=zstd,cluster_size=2097152")},
	{"qcow2-odd-size", qcow2From(7<<20 + 1234)},
	{"qcow2-zero-clusters", qcow2Written("16M", "",
		"write -P 0x5a 0 4M", "write -z 1M 1M", "write -z -u 3M 64k", "write -P 0 8M 64k", "discard 2M 512k")},
	{"qcow2-v2-zeroes-written", qcow2Written("16M", "compat=0.10", "write -P 0x33 0 2M", "write -z 512k 512k")},
	{"qcow2-prealloc-metadata", qcow2Written("16M", "preallocation=metadata", "write -P 0x77 4M 100k")},
	{"qcow2-prealloc-falloc", qcow2Written("16M", "preallocation=falloc", "write -P 0x78 1M 64k")},
	{"qcow2-prealloc-full", qcow2Written("16M", "preallocation=full", "write -P 0x79 9M 300k")},
	{"qcow2-odd-virtual-size", qcow2Written("10000384", "", "write -P 0x11 9999872 512")},
	{"qcow2-partial-clusters", qcow2Written("16M", "", "write -P 0xee 100000 7", "write -P 0xef 15M 513")},
	{"qcow2-snapshot", func(t *testing.T, dir string) string {
		p := qcow2Written("16M", "", "write -P 0x01 0 1M")(t, dir)
		run(t, "qemu-img", "snapshot", "-c", "before", p)
		run(t, "qemu-io", "-c", "write -P 0x02 512k 1M", p)
		return p
	}},
	{"qcow2-bitmap", func(t *testing.T, dir string) string {
		p := qcow2Written("16M", "", "write -P 0x03 0 1M")(t, dir)
		run(t, "qemu-img", "bitmap", "--add", p, "dirty0")
		return p
	}},
	{"gzip-raw", wrapped("gz", rawImage(12<<20))},
	{"zstd-qcow2", wrapped("zst", qcow2From(12<<20, "-c"))},
	{"xz-qcow2", wrapped("xz", qcow2From(6<<20))},
}

// unwrapped returns the file a wrapped corpus image was made from.
func unwrapped(path string) (string, string) {
	for ext, wrapper := range map[string]string{".gz": "gzip", ".zst": "zstd", ".xz": "xz"} {
		if strings.HasSuffix(path, ext) {
			return strings.TrimSuffix(path, ext), wrapper
		}
	}
	return path, ""
}

// TestOracleCorpus checks, for every image qemu-img can make: inspect agrees
// with qemu-img info and map, and both output formats pass qemu-img check
// and compare identical to the source; qcow2 output is at least as sparse as
// qemu-img's own conversion.
func TestOracleCorpus(t *testing.T) {
	testenv.RequireQEMU(t)
	for _, c := range corpus {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			src := c.build(t, dir)
			plain, wrapper := unwrapped(src)
			want := qemuInfo(t, plain)

			got := inspect(t, src)
			if got.Verdict != api.VerdictAccepted {
				t.Fatalf("inspect rejected a valid image: %+v", got.Reasons)
			}
			if got.Wrapper != wrapper {
				t.Errorf("wrapper = %q, want %q", got.Wrapper, wrapper)
			}
			if got.Format != want.Format || got.VirtualSize != want.VirtualSize {
				t.Errorf("inspect says %s %d bytes, qemu-img says %s %d bytes", got.Format, got.VirtualSize, want.Format, want.VirtualSize)
			}
			if want.Format == "qcow2" {
				if got.ClusterSize != want.ClusterSize || got.Compat != want.FormatSpecific.Data.Compat {
					t.Errorf("inspect says cluster %d compat %s, qemu-img says %d %s", got.ClusterSize, got.Compat, want.ClusterSize, want.FormatSpecific.Data.Compat)
				}
				if ct := want.FormatSpecific.Data.CompressionType; ct != "" && got.CompressionType != ct {
					t.Errorf("compression type %q, qemu-img says %q", got.CompressionType, ct)
				}
			}
			if wrapper == "" {
				if alloc := qemuAllocated(t, plain, want.Format); got.AllocatedSize != alloc {
					t.Errorf("allocated size %d, qemu-img map says %d", got.AllocatedSize, alloc)
				}
			}

			for _, to := range []string{"qcow2", "raw"} {
				out := filepath.Join(dir, "out."+to)
				run(t, testenv.Imagectl, "convert", "--to", to, src, out)
				if to == "qcow2" {
					run(t, "qemu-img", "check", "-q", out)
					oi := qemuInfo(t, out)
					if oi.ClusterSize != 64<<10 || oi.FormatSpecific.Data.Compat != "1.1" {
						t.Errorf("output is cluster %d compat %s, want 65536 and 1.1", oi.ClusterSize, oi.FormatSpecific.Data.Compat)
					}
					ref := filepath.Join(dir, "ref.qcow2")
					run(t, "qemu-img", "convert", "-f", want.Format, "-O", "qcow2", plain, ref)
					if ours, theirs := qemuAllocated(t, out, "qcow2"), qemuAllocated(t, ref, "qcow2"); ours > theirs {
						t.Errorf("our qcow2 stores %d bytes of data, qemu-img's %d", ours, theirs)
					}
				}
				run(t, "qemu-img", "compare", "-q", "-f", want.Format, "-F", to, plain, out)
				// Streaming to stdout takes another path (size first,
				// metadata first); it must be just as right.
				streamed := filepath.Join(dir, "streamed."+to)
				if err := os.WriteFile(streamed, run(t, testenv.Imagectl, "convert", "--to", to, src, "-"), 0o644); err != nil {
					t.Fatal(err)
				}
				if to == "qcow2" {
					run(t, "qemu-img", "check", "-q", streamed)
				}
				run(t, "qemu-img", "compare", "-q", "-f", want.Format, "-F", to, plain, streamed)
				os.Remove(out)
			}
		})
	}
}
