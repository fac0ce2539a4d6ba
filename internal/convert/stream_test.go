package convert

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/imagepipe/imagepipe/internal/need"
	"github.com/imagepipe/imagepipe/internal/reject"
)

// streamThrough passes file through a StreamCheck in writes of random
// sizes and returns the outcome, the info and what the fallback got.
func streamThrough(t *testing.T, file []byte, maxVirtual int64) (StreamOutcome, Info, []byte) {
	t.Helper()
	outcome, info, fallback, err := streamCheck(t, file, maxVirtual)
	if err != nil {
		t.Fatal(err)
	}
	return outcome, info, fallback
}

func streamCheck(t *testing.T, file []byte, maxVirtual int64) (StreamOutcome, Info, []byte, error) {
	t.Helper()
	var fallback bytes.Buffer
	s := NewStreamCheck(int64(len(file)), OpenOptions{MaxVirtualSize: maxVirtual}, &fallback)
	rng := rand.New(rand.NewPCG(uint64(len(file)), 7))
	for p := file; len(p) > 0; {
		k := min(len(p), 1+rng.IntN(200<<10))
		if _, err := s.Write(p[:k]); err != nil {
			t.Fatal(err)
		}
		p = p[k:]
	}
	outcome, info, err := s.Finish(t.Context())
	return outcome, info, fallback.Bytes(), err
}

// canonicalFile is what imagectl stores for a 3-cluster-and-a-sector raw
// disk with data in its first and last clusters.
func canonicalFile(t *testing.T) []byte {
	vsize := int64(3*DefaultClusterSize + 512)
	raw := sparseRaw(vsize, 100, vsize-600)
	return convertBytes(t, raw, Options{})
}

func TestStreamCheckAcceptsWhatTheWriterMakes(t *testing.T) {
	for _, raw := range [][]byte{
		sparseRaw(3*DefaultClusterSize+512, 100, 3*DefaultClusterSize-88),
		sparseRaw(1100<<20, 0, 200<<20, 700<<20, 1100<<20-3000), // three L2 tables
		sparseRaw(1 << 20), // no data at all
	} {
		file := convertBytes(t, raw, Options{})
		outcome, info, got := streamThrough(t, file, 0)
		if outcome != StreamCanonical || len(got) != 0 {
			t.Fatalf("%d-byte disk: outcome %d, %d bytes to the fallback; want canonical, none", len(raw), outcome, len(got))
		}
		if info.Format != FormatQCOW2 || info.VirtualSize != int64(len(raw)) {
			t.Errorf("info %+v, want qcow2 of %d bytes", info, len(raw))
		}
	}
}

// TestStreamCheckDivertsAnythingElse: every file that is not the writer's
// own goes whole, byte for byte, to the fallback, where the usual
// verification reads it.
func TestStreamCheckDivertsAnythingElse(t *testing.T) {
	canonical := canonicalFile(t)
	be := binary.BigEndian
	l2At := func(b []byte) int { // the first L2 table, from the first L1 entry
		return int(be.Uint64(b[be.Uint64(b[40:]):]) &^ entryCopied)
	}
	cases := map[string]func([]byte) []byte{
		"raw disk": func([]byte) []byte { return sparseRaw(4*DefaultClusterSize, 10) },
		"L2 entry without COPIED": func(b []byte) []byte {
			l2 := l2At(b)
			be.PutUint64(b[l2:], be.Uint64(b[l2:])&^entryCopied)
			return b
		},
		"refcount 2": func(b []byte) []byte {
			rb := int(be.Uint64(b[int(be.Uint64(b[48:])):]))
			be.PutUint16(b[rb:], 2)
			return b
		},
		"a header extension": func(b []byte) []byte {
			copy(b[outHeaderLength:], []byte{0x68, 0x80, 0x3f, 0x8a, 0, 0, 0, 0})
			return b
		},
		"virtual size not whole sectors": func(b []byte) []byte {
			be.PutUint64(b[24:], be.Uint64(b[24:])-1)
			return b
		},
		"data clusters swapped": func(b []byte) []byte {
			// the L2 entries of guest clusters 0 and 3, swapped: valid qcow2
			// whose data is not in guest order.
			l2 := l2At(b)
			e0, e3 := be.Uint64(b[l2:]), be.Uint64(b[l2+24:])
			be.PutUint64(b[l2:], e3)
			be.PutUint64(b[l2+24:], e0)
			return b
		},
		"cut short of its tables": func(b []byte) []byte { return b[:2*DefaultClusterSize] },
	}
	for name, edit := range cases {
		t.Run(name, func(t *testing.T) {
			file := edit(bytes.Clone(canonical))
			outcome, _, got := streamThrough(t, file, 0)
			if outcome != StreamDiverted || !bytes.Equal(got, file) {
				t.Fatalf("outcome %d with %d of %d bytes in the fallback; want diverted, all of them", outcome, len(got), len(file))
			}
		})
	}
}

// TestStreamCheckLosesOnlyDataItCannotKeep: a file whose tables are the
// writer's but whose data is not (a stored cluster of zeros, bytes past
// the virtual size) is lost: it must be read again.
func TestStreamCheckLosesOnlyDataItCannotKeep(t *testing.T) {
	canonical := canonicalFile(t)
	cs := DefaultClusterSize
	for name, edit := range map[string]func([]byte){
		"a stored cluster of zeros": func(b []byte) { clear(b[len(b)-2*cs : len(b)-cs]) },
		"bytes past the virtual size": func(b []byte) {
			b[len(b)-1] = 1
		},
	} {
		t.Run(name, func(t *testing.T) {
			file := bytes.Clone(canonical)
			edit(file)
			if outcome, _, _ := streamThrough(t, file, 0); outcome != StreamLost {
				t.Fatalf("outcome %d, want lost", outcome)
			}
		})
	}
}

func TestStreamCheckHonoursItsLimits(t *testing.T) {
	file := canonicalFile(t)
	if outcome, _, got := streamThrough(t, file, 2*DefaultClusterSize); outcome != StreamDiverted || len(got) != len(file) {
		t.Errorf("over the virtual size limit: outcome %d, %d bytes diverted; want diverted, all", outcome, len(got))
	}
	// One cluster in every 512 MiB needs an L2 table each: 200 of them
	// are held, 300 (over 16 MiB) are too many.
	for tables, want := range map[int64]StreamOutcome{200: StreamCanonical, 300: StreamDiverted} {
		file := layoutFile(t, tables*(512<<20), tables)
		if outcome, _, _ := streamThrough(t, file, 0); outcome != want {
			t.Errorf("%d L2 tables: outcome %d, want %d", tables, outcome, want)
		}
	}

	s := NewStreamCheck(int64(len(file)), OpenOptions{}, &bytes.Buffer{})
	if _, err := s.Write(append(bytes.Clone(file), 0)); err == nil {
		t.Error("a stream longer than declared was taken")
	}
	s = NewStreamCheck(int64(len(file)), OpenOptions{}, &bytes.Buffer{})
	s.Write(file[:len(file)-1])
	if _, _, err := s.Finish(t.Context()); err == nil {
		t.Error("a stream shorter than declared finished")
	}
}

// layoutFile is the writer's file for a disk of vsize bytes with data in
// the first cluster of each of its first tables L2 tables' ranges, made
// from the layout directly: the writer would need the whole disk in hand.
func layoutFile(t *testing.T, vsize, tables int64) []byte {
	t.Helper()
	cs := int64(DefaultClusterSize)
	nonzero := newBitmap(ceilDiv(vsize, cs))
	for j := range tables {
		nonzero.set(j * (cs / 8))
	}
	l := newQCOWLayout(vsize, cs, nonzero, false)
	file := make([]byte, l.fileSize())
	err := l.writeMetadata(func(cluster int64, b []byte) error {
		copy(file[cluster*cs:], b)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for c := l.dataStart(); c < l.totalClusters(); c++ {
		file[c*cs] = 1
	}
	return file
}

// TestStreamCheckDivertsQEMUsFiles: qemu-img's own qcow2 layout is not the
// writer's, so it takes the usual path.
func TestStreamCheckDivertsQEMUsFiles(t *testing.T) {
	qemuImg := need.Program(t, "qemu-img")
	dir := t.TempDir()
	raw := filepath.Join(dir, "disk.raw")
	if err := os.WriteFile(raw, sparseRaw(4<<20, 0, 3<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "disk.qcow2")
	if b, err := exec.Command(qemuImg, "convert", "-O", "qcow2", raw, out).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img convert: %v\n%s", err, b)
	}
	file, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if outcome, _, got := streamThrough(t, file, 0); outcome != StreamDiverted || !bytes.Equal(got, file) {
		t.Fatalf("outcome %d, %d of %d bytes diverted; want diverted, all", outcome, len(got), len(file))
	}
}

// TestStreamCheckRefusesWhatOpenRefuses: the checks that read more than
// the tables (a VHD footer or a DMG trailer in the last sector makes the
// file a polyglot) give the same verdict as opening the whole file.
func TestStreamCheckRefusesWhatOpenRefuses(t *testing.T) {
	for _, trailer := range []string{"conectix", "koly"} {
		// The guest's last sector is the file's: its last cluster is data.
		file := convertBytes(t, sparseRaw(4*DefaultClusterSize, 0, 4*DefaultClusterSize-3000), Options{})
		copy(file[len(file)-512:], trailer)
		outcome, _, _, err := streamCheck(t, file, 0)
		img, whole := Open(bytes.NewReader(file), int64(len(file)), OpenOptions{})
		if whole == nil {
			_, whole = img.Verify(t.Context())
		}
		if outcome != StreamCanonical || reject.As(whole) == nil || reject.As(err) == nil || reject.As(err).Reason != reject.As(whole).Reason {
			t.Errorf("%q in the last sector: streamed %d, %v; whole file %v; want the same refusal", trailer, outcome, err, whole)
		}
	}
}
