package convert

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/imagepipe/imagepipe/internal/need"
	"github.com/imagepipe/imagepipe/internal/reject"
)

// qemuSeeds are the FuzzOpen seeds that QEMU makes, testdata/fuzz/FuzzOpen/
// qemu-<name>: whole images of a 64 KiB disk with 512-byte clusters, so
// that they stay a few KiB, each reaching a case of checkImage that the
// hostile seeds (heads of larger files, refused at the header or at their
// L1 table) and the package's own writer do not. TestWriteQEMUFuzzSeeds
// writes them; TestQEMUFuzzSeeds checks they mean what they say.
var qemuSeeds = []struct {
	name   string
	create string   // qemu-img create -o options, besides cluster_size=512
	io     []string // qemu-io commands in order; "snapshot" takes an internal snapshot
	cut    int      // bytes cut off the end of the file
	want   reject.Reason
}{
	// Data, a zero-flagged cluster that keeps its allocation, a data
	// cluster of zeros, and data in the second L2 table.
	{name: "v3", create: "compat=1.1", io: []string{"write -P 0x11 0 1536", "write -z 512 512", "write -P 0 16k 512", "write -P 0x22 40k 512"}},
	// Version 2: no zero flag.
	{name: "v2", create: "compat=0.10", io: []string{"write -P 0x11 0 1536", "write -P 0 16k 512", "write -P 0x22 40k 512"}},
	// Byte-packed compressed clusters, one of them of zeros, beside data.
	{name: "zlib", create: "compression_type=zlib", io: []string{"write -c -P 0x33 0 2k", "write -c -P 0 4k 512", "write -P 0x44 40k 512"}},
	{name: "zstd", create: "compression_type=zstd", io: []string{"write -c -P 0x33 0 2k", "write -c -P 0 4k 512", "write -P 0x44 40k 512"}},
	// An internal snapshot: the active tables reach clusters of refcount
	// 2, whose entries lack the COPIED flag, and one copied since.
	{name: "snapshot", io: []string{"write -P 0x55 0 2k", "snapshot", "write -P 0x66 512 512"}},
	// A guest disk that starts with a qcow2 header: accepted, but raw
	// output is refused.
	{name: "guest-is-qcow2", io: []string{"write -P 0x51 0 1", "write -P 0x46 1 1", "write -P 0x49 2 1", "write -P 0xfb 3 1", "write -P 3 7 1"}, want: reject.AmbiguousRaw},
	// Cut before its last data cluster: refused by Verify, not Open.
	{name: "data-past-eof", io: []string{"write -P 0x11 0 512", "write -P 0x22 40k 512"}, cut: 512, want: reject.L2Table},
}

// TestWriteQEMUFuzzSeeds writes qemuSeeds to testdata/fuzz/FuzzOpen. It
// only runs with IMAGEPIPE_WRITE_SEEDS=1, since it writes into the source
// tree.
func TestWriteQEMUFuzzSeeds(t *testing.T) {
	need.OptIn(t, "IMAGEPIPE_WRITE_SEEDS", "rewrite testdata/fuzz/FuzzOpen/qemu-*")
	qemuImg := need.Program(t, "qemu-img")
	qemuIO := need.Program(t, "qemu-io")
	for _, s := range qemuSeeds {
		path := filepath.Join(t.TempDir(), "disk.qcow2")
		opts := "cluster_size=512"
		if s.create != "" {
			opts += "," + s.create
		}
		run(t, qemuImg, "create", "-q", "-f", "qcow2", "-o", opts, path, "64k")
		for _, c := range s.io {
			if c == "snapshot" {
				run(t, qemuImg, "snapshot", "-c", "s1", path)
				continue
			}
			run(t, qemuIO, "-f", "qcow2", "-c", c, path)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		b = b[:len(b)-s.cut]
		seed := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", b)
		if err := os.WriteFile(filepath.Join("testdata", "fuzz", "FuzzOpen", "qemu-"+s.name), []byte(seed), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestQEMUFuzzSeeds checks that each QEMU-made FuzzOpen seed reaches its
// case: accepted, accepted with raw output refused, or refused by Verify
// (after Open) for its reason; and that no other qemu-* seed lies around.
func TestQEMUFuzzSeeds(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "fuzz", "FuzzOpen", "qemu-*"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != len(qemuSeeds) {
		t.Errorf("%d qemu-* seeds in testdata/fuzz/FuzzOpen, %d in qemuSeeds", len(files), len(qemuSeeds))
	}
	for _, s := range qemuSeeds {
		t.Run(s.name, func(t *testing.T) {
			args, err := readCorpusFile(filepath.Join("testdata", "fuzz", "FuzzOpen", "qemu-"+s.name))
			if err != nil {
				t.Fatal(err) // IMAGEPIPE_WRITE_SEEDS=1 go test -run TestWriteQEMUFuzzSeeds writes it
			}
			b, _ := args[0].([]byte)
			img, _, err := openBytes(t, b, OpenOptions{MaxVirtualSize: fuzzMaxVirtual})
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			_, err = img.Verify(t.Context())
			if err == nil && s.want == reject.AmbiguousRaw {
				err = img.checkRawOutput(t.Context())
			}
			if re := reject.As(err); (s.want == "" && err != nil) || (s.want != "" && (re == nil || re.Reason != s.want)) {
				t.Fatalf("%v, want %q", err, s.want)
			}
		})
	}
}

// qemuSeedHeads are the header clusters of the QEMU-made FuzzOpen seeds,
// with their file sizes: FuzzQCOW2Header seeds of QEMU's v2 and v3
// headers, with extensions and each codec.
func qemuSeedHeads(tb testing.TB) (heads [][]byte, sizes []int64) {
	for _, s := range qemuSeeds {
		args, err := readCorpusFile(filepath.Join("testdata", "fuzz", "FuzzOpen", "qemu-"+s.name))
		if err != nil {
			tb.Fatal(err)
		}
		b, _ := args[0].([]byte)
		if !strings.HasPrefix(string(b), "QFI\xfb") || len(b) < 512 {
			tb.Fatalf("qemu-%s is not a qcow2 image", s.name)
		}
		heads = append(heads, b[:512])
		sizes = append(sizes, int64(len(b)))
	}
	return heads, sizes
}
