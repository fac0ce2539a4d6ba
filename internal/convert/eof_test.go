package convert

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/imagepipe/imagepipe/internal/need"
	"github.com/imagepipe/imagepipe/internal/reject"
)

// judge returns what Verify says of an in-memory image, the rejection every
// other entry point must repeat (nil when accepted), and the raw disk of
// an accepted one.
func judge(t *testing.T, b []byte) (*reject.Error, []byte) {
	t.Helper()
	img, _, err := openBytes(t, b, OpenOptions{})
	if err == nil {
		_, err = img.Verify(t.Context())
	}
	if err != nil {
		re := reject.As(err)
		if re == nil {
			t.Fatalf("a non-rejection error: %v", err)
		}
		checkSameVerdictEverywhere(t, b, re)
		return re, nil
	}
	return nil, convertBytes(t, b, Options{To: FormatRaw})
}

// TestClusterStartingAtEndOfFileRefused: a data cluster or a compressed
// stream that starts exactly at the end of the file has none of its bytes
// in the file and is refused as out of bounds, with the rejection a
// cluster further past the end gets, by every entry point. One byte
// before the end, a data cluster's start exists and reads as QEMU reads a
// short last cluster (its byte, then zeros); a compressed stream of one
// byte cannot hold a cluster and is refused.
func TestClusterStartingAtEndOfFileRefused(t *testing.T) {
	// build lays out a 64 KiB-cluster image of 1 MiB with one L2 table,
	// then a free cluster if free, then extra bytes of 0x5a; place returns
	// guest cluster 0's L2 entry given the file's size.
	build := func(free bool, extra int, place func(q *qcowBuilder, size int64) uint64) []byte {
		q := newQCOWBuilder(16, 1<<20, false)
		l2 := q.alloc(1)
		q.setL1(0, l2)
		if free {
			q.alloc(1)
		}
		q.b = append(q.b, bytes.Repeat([]byte{0x5a}, extra)...)
		q.setL2(l2, 0, place(q, int64(len(q.b))))
		return q.bytes()
	}
	cs := int64(1) << 16
	for _, tc := range []struct {
		name   string
		img    []byte
		reason reject.Reason // "" for acceptance
		detail string        // what the rejection says of {size} and {host}
	}{
		{"data/at-the-end-of-the-file", build(false, 0, func(q *qcowBuilder, size int64) uint64 {
			return q.data(size)
		}), reject.L2Table, "is at {host}, past the end of the {size}-byte file"},
		{"data/a-cluster-past-the-end", build(false, 0, func(q *qcowBuilder, size int64) uint64 {
			return q.data(size + cs)
		}), reject.L2Table, "past the end of the {size}-byte file"},
		// The file ends one byte into the cluster.
		{"data/one-byte-before-the-end", build(false, 1, func(q *qcowBuilder, size int64) uint64 {
			return q.data(size - 1)
		}), "", ""},
		// One sector ends within the allowed 512 bytes past the end of
		// the file: only the start is out of bounds.
		{"compressed/at-the-end-of-the-file", build(true, 0, func(q *qcowBuilder, size int64) uint64 {
			return q.compressed(size, 1)
		}), reject.CompressedCluster, "points to {host}, outside the {size}-byte file"},
		{"compressed/a-cluster-past-the-end", build(true, 0, func(q *qcowBuilder, size int64) uint64 {
			return q.compressed(size+cs, 1)
		}), reject.CompressedCluster, "outside the {size}-byte file"},
		{"compressed/one-byte-before-the-end-three-sectors", build(true, 0, func(q *qcowBuilder, size int64) uint64 {
			return q.compressed(size-1, 1025)
		}), reject.CompressedCluster, "(1025 bytes at {host}) runs past the end of the file"},
		{"compressed/one-byte-before-the-end-one-sector", build(true, 0, func(q *qcowBuilder, size int64) uint64 {
			return q.compressed(size-1, 1)
		}), reject.CompressedCluster, "ends before a full cluster of data"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			re, raw := judge(t, tc.img)
			if tc.reason == "" {
				if re != nil {
					t.Fatalf("%v; want acceptance", re)
				}
				want := make([]byte, 1<<20)
				want[0] = 0x5a
				if !bytes.Equal(raw, want) {
					t.Fatal("the guest disk is not the cluster's one byte followed by zeros")
				}
				return
			}
			if re == nil || re.Reason != tc.reason {
				t.Fatalf("%v; want a %s rejection", re, tc.reason)
			}
			host, _ := firstCluster(t, tc.img)
			want := strings.NewReplacer("{size}", fmt.Sprint(len(tc.img)), "{host}", fmt.Sprintf("%#x", host)).Replace(tc.detail)
			if !strings.Contains(re.Detail, want) {
				t.Errorf("%q does not say %q", re.Detail, want)
			}
		})
	}
}

// TestClusterAtEndOfFileAgreesWithQEMU truncates images qemu-img made so
// that guest cluster 0 (a data cluster, or a compressed stream of one
// sector) starts exactly at the end of the file, or one byte before it,
// and holds the verdict against QEMU's: refused where qemu-img check
// reports corruption or qemu-img convert fails, otherwise accepted with
// the bytes qemu-img convert reads.
func TestClusterAtEndOfFileAgreesWithQEMU(t *testing.T) {
	qemuImg := need.Program(t, "qemu-img")
	qemuIO := need.Program(t, "qemu-io")
	dir := t.TempDir()
	data := filepath.Join(dir, "data.qcow2")
	run(t, qemuImg, "create", "-q", "-f", "qcow2", data, "1M")
	run(t, qemuIO, "-f", "qcow2", "-c", "write -P 0x5a 0 64k", data)
	raw := filepath.Join(dir, "disk.raw")
	if err := os.WriteFile(raw, append(bytes.Repeat([]byte("a"), 64<<10), make([]byte, 192<<10)...), 0o644); err != nil {
		t.Fatal(err)
	}
	comp := filepath.Join(dir, "comp.qcow2")
	run(t, qemuImg, "convert", "-q", "-c", "-f", "raw", "-O", "qcow2", raw, comp)

	for _, tc := range []struct {
		name   string
		src    string
		before int64 // bytes of the cluster left in the file
		refuse bool
		detail string // what our rejection says of {size}, if anything
	}{
		{"data/at-the-end-of-the-file", data, 0, true, "past the end of the {size}-byte file"},
		{"data/one-byte-before-the-end", data, 1, false, ""},
		{"compressed/at-the-end-of-the-file", comp, 0, true, "outside the {size}-byte file"},
		{"compressed/one-byte-before-the-end", comp, 1, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := os.ReadFile(tc.src)
			if err != nil {
				t.Fatal(err)
			}
			host, sectors := firstCluster(t, b)
			if sectors > 1 {
				t.Fatalf("qemu-img stored guest cluster 0 in %d sectors; the case needs one", sectors)
			}
			b = b[:host+tc.before]
			path := filepath.Join(t.TempDir(), "cut.qcow2")
			if err := os.WriteFile(path, b, 0o644); err != nil {
				t.Fatal(err)
			}

			// QEMU's verdict: check's exit status 2 is corruption (3 is
			// leaks only, which a reader does not care about).
			check, checkErr := exec.Command(qemuImg, "check", "-f", "qcow2", path).CombinedOutput()
			var exit *exec.ExitError
			corrupt := errors.As(checkErr, &exit) && exit.ExitCode() == 2
			if checkErr != nil && !corrupt && !(errors.As(checkErr, &exit) && exit.ExitCode() == 3) {
				t.Fatalf("qemu-img check: %v\n%s", checkErr, check)
			}
			out := filepath.Join(t.TempDir(), "out.raw")
			conv, convErr := exec.Command(qemuImg, "convert", "-f", "qcow2", "-O", "raw", path, out).CombinedOutput()
			qemuRefuses := corrupt || convErr != nil
			t.Logf("qemu-img check: corrupt=%v; qemu-img convert: %v %s", corrupt, convErr, bytes.TrimSpace(conv))
			if qemuRefuses != tc.refuse {
				t.Fatalf("QEMU refuses: %v, the case expects %v (check: %s)", qemuRefuses, tc.refuse, check)
			}

			re, ours := judge(t, b)
			if !tc.refuse {
				if re != nil {
					t.Fatalf("%v; qemu-img reads it", re)
				}
				want, err := os.ReadFile(out)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(ours, want) {
					t.Fatal("the guest disk differs from what qemu-img convert reads")
				}
				return
			}
			if re == nil {
				t.Fatal("accepted; QEMU refuses it")
			}
			if want := strings.ReplaceAll(tc.detail, "{size}", fmt.Sprint(len(b))); !strings.Contains(re.Detail, want) {
				t.Errorf("%q does not say %q", re.Detail, want)
			}
		})
	}
}

// firstCluster reads guest cluster 0's host offset from a qcow2 file with
// one L2 table, and for a compressed cluster its sector count (0 for a
// data cluster), without the package's reader.
func firstCluster(t *testing.T, b []byte) (host, sectors int64) {
	t.Helper()
	be := binary.BigEndian
	bits := be.Uint32(b[20:])
	l2 := be.Uint64(b[be.Uint64(b[40:]):]) & l1OffsetMask
	e := be.Uint64(b[l2:])
	if e&entryCompressed == 0 {
		if e&l2OffsetMask == 0 {
			t.Fatalf("guest cluster 0 is not allocated (%#x)", e)
		}
		return int64(e & l2OffsetMask), 0
	}
	x := 62 - (bits - 8)
	return int64(e & (1<<x - 1)), int64(e>>x&(1<<(bits-8)-1)) + 1
}
