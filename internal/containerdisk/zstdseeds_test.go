package containerdisk

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/imagepipe/imagepipe/internal/need"
)

// TestWriteZstdFuzzSeeds writes FuzzZstdAgainstCDI's seed corpus,
// testdata/fuzz/FuzzZstdAgainstCDI: the zstd layer of a 64 KiB disk made
// by imagepipe's writer, by the zstd program with several options and by
// klauspost/compress, imagepipe's layers of a tiny disk and of one whose
// tar decodes past the fuzz target's limit, and frames made by hand
// around them: a lead frame holding a compressed block, several frames,
// skippable frames, raw and RLE blocks, dictionary IDs, window sizes,
// checksums right and wrong, trailing bytes, more output than the fuzz
// target compares. It only runs with
// IMAGEPIPE_WRITE_SEEDS=1, since it writes into the source tree.
func TestWriteZstdFuzzSeeds(t *testing.T) {
	need.OptIn(t, "IMAGEPIPE_WRITE_SEEDS", "rewrite testdata/fuzz/FuzzZstdAgainstCDI")
	zstdProgram := need.Program(t, "zstd")
	rng := rand.New(rand.NewPCG(3, 4))
	disk := make([]byte, 64<<10)
	copy(disk, bytes.Repeat([]byte("QFI\xfb not a header, text that compresses "), 100))
	for i := 20 << 10; i < 28<<10; i++ {
		disk[i] = byte(rng.Uint32())
	}
	layer, tarball := zstdLayer(t, disk)
	small, _ := zstdLayer(t, []byte("a disk of a few bytes"))
	overLimit, _ := zstdLayer(t, make([]byte, zstdDiffLimit+1<<20))
	cli := func(args ...string) []byte {
		t.Helper()
		cmd := exec.Command(zstdProgram, append([]string{"-q", "-c"}, args...)...)
		cmd.Stdin = bytes.NewReader(tarball) // a stream: no content size in the header
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("zstd %v: %v", args, err)
		}
		return out
	}
	dictDir := t.TempDir()
	var samples []string
	for i := range 40 {
		p := filepath.Join(dictDir, fmt.Sprint(i))
		if err := os.WriteFile(p, tarball[i*1024:i*1024+4096], 0o644); err != nil {
			t.Fatal(err)
		}
		samples = append(samples, p)
	}
	dict := filepath.Join(dictDir, "dict")
	if out, err := exec.Command(zstdProgram, append([]string{"-q", "--train", "--maxdict=4096", "-o", dict}, samples...)...).CombinedOutput(); err != nil {
		t.Fatalf("zstd --train: %v: %s", err, out)
	}
	var klaus bytes.Buffer
	enc, err := zstd.NewWriter(&klaus)
	if err != nil {
		t.Fatal(err)
	}
	enc.Write(tarball)
	enc.Close()

	lead := rawZstdFrame(tarball[:1024])
	body := cli("--no-check") // of the whole tar; cut below where frames are joined
	rest := func() []byte {
		cmd := exec.Command(zstdProgram, "-q", "-c")
		cmd.Stdin = bytes.NewReader(tarball[1024:])
		out, err := cmd.Output()
		if err != nil {
			t.Fatal(err)
		}
		return out
	}()
	badSum := cli()
	badSum[len(badSum)-1] ^= 0xff
	withDictID := append(append(append([]byte(nil), lead[:4]...), lead[4]|1, 7), lead[5:]...) // FHD gains a 1-byte dictionary ID
	fcsOff := append([]byte(nil), lead...)
	fcsOff[5]++ // the single segment's declared size is one more than its block

	seeds := map[string][]byte{
		"imagepipe":              layer,
		"cli-default":            cli(),
		"cli-no-check":           body,
		"cli-19-long27":          cli("-19", "--long=27"),
		"cli-window-1k":          cli("--zstd=wlog=10"),
		"cli-dictionary":         cli("-D", dict),
		"klauspost-default":      klaus.Bytes(),
		"two-frames":             append(append([]byte(nil), lead...), rest...),
		"skippable-between":      concat(lead, skippableFrame(0x184D2A53, []byte("between")), rest),
		"skippable-after":        concat(layer, skippableFrame(0x184D2A5F, []byte("after"))),
		"empty-frame-first":      concat(rawZstdFrame(nil), layer),
		"raw-and-rle-blocks":     blockFrame(tarball, 0),
		"raw-and-rle-window":     blockFrame(tarball, 17),
		"window-256m":            blockFrame(tarball, 18<<3),
		"window-1g":              blockFrame(tarball, 20<<3),
		"over-the-limit":         blockFrame(concat(tarball, make([]byte, zstdDiffLimit)), 10<<3),
		"dictionary-id":          concat(withDictID, rest),
		"checksum-wrong":         badSum,
		"single-segment-fcs-off": concat(fcsOff, rest),
		"trailing-garbage":       concat(layer, []byte("garbage!")),
		"trailing-zeros":         concat(layer, make([]byte, 16)),
		"truncated":              layer[:len(layer)-3],
		"lead-block-compressed":  compressedLead(t, layer, tarball),
		"imagepipe-small":        small,
		"imagepipe-over-limit":   overLimit,
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzZstdAgainstCDI")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, b := range seeds {
		seed := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", b)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(seed), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func concat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// compressedLead is layer, imagepipe's zstd layer of tarball, with its
// lead frame's raw block replaced by a compressed block of the same 1024
// bytes under the same frame header: a first block that ends long before
// byte 512, which CDI's header probe overwrites before it decodes what
// follows. Only the lead frame's block header tells it from imagepipe's
// framing.
func compressedLead(tb testing.TB, layer, tarball []byte) []byte {
	tb.Helper()
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderCRC(false), zstd.WithSingleSegment(true))
	if err != nil {
		tb.Fatal(err)
	}
	defer enc.Close()
	frame := enc.EncodeAll(tarball[:zstdLeadSize], nil)
	walk := newZstdFrames()
	walk.Write(frame)
	if !walk.ended() || walk.frames != 1 || walk.kept[0].block[0]>>1&3 != 2 {
		tb.Fatalf("klauspost's frame of the tar headers is not one frame of a compressed block: % x", frame)
	}
	prefix := zstdLeadPrefix(zstdLeadSize)
	header := prefix[:len(prefix)-3] // the lead frame's header, without its block header
	return concat(header, frame[len(walk.kept[0].header):], layer[len(prefix)+zstdLeadSize:])
}

// skippableFrame is a zstd skippable frame of magic (0x184D2A50 to
// 0x184D2A5F) holding data.
func skippableFrame(magic uint32, data []byte) []byte {
	f := binary.LittleEndian.AppendUint32(nil, magic)
	f = binary.LittleEndian.AppendUint32(f, uint32(len(data)))
	return append(f, data...)
}

// blockFrame is one zstd frame of data made of raw blocks, and RLE
// blocks for runs of 64 equal bytes or more, with the window descriptor
// byte wd (exponent<<3 | mantissa) and no checksum. The first block holds
// the first 1024 bytes raw.
func blockFrame(data []byte, wd byte) []byte {
	f := binary.LittleEndian.AppendUint32(nil, 0xFD2FB528)
	f = append(f, 0x00, wd) // no content size, no checksum, no dictionary
	block := func(typ uint32, size int, content []byte, last bool) {
		h := uint32(size)<<3 | typ<<1
		if last {
			h |= 1
		}
		f = append(f, byte(h), byte(h>>8), byte(h>>16))
		f = append(f, content...)
	}
	block(0, 1024, data[:1024], len(data) == 1024)
	for i := 1024; i < len(data); {
		run := 1
		for i+run < len(data) && data[i+run] == data[i] && run < 128<<10 {
			run++
		}
		n := run
		if run < 64 {
			n = 1
			for i+n < len(data) && n < 128<<10 && !(i+n+64 <= len(data) && bytes.Count(data[i+n:i+n+64], data[i+n:i+n+1]) == 64) {
				n++
			}
		}
		last := i+n == len(data)
		if run >= 64 {
			block(1, n, data[i:i+1], last)
		} else {
			block(0, n, data[i:i+n], last)
		}
		i += n
	}
	return f
}
