package hostile

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/imagepipe/imagepipe/internal/convert"
	"github.com/imagepipe/imagepipe/internal/reject"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// Offsets of qcow2 header fields (all big-endian), as in QEMU's docs/interop/qcow2.txt.
const (
	offBackingOffset    = 8
	offClusterBits      = 20
	offSize             = 24
	offCryptMethod      = 32
	offL1Size           = 36
	offL1Offset         = 40
	offRefcountOffset   = 48
	offRefcountClusters = 56
	offNbSnapshots      = 60
	offSnapshotsOffset  = 64
	offIncompatible     = 72
	offRefcountOrder    = 96
	offHeaderLength     = 100
)

const (
	// offsetMask keeps bits 9-55 of an L1 entry or a standard L2 entry: the host offset.
	offsetMask     = 0x00ff_ffff_ffff_fe00
	flagCopied     = 1 << 63
	flagCompressed = 1 << 62
	// pastEOF is a cluster-aligned host offset far beyond the end of any image built here.
	pastEOF = 1 << 40
	// maxCheckAlloc bounds what the engine may allocate while judging one image. The
	// corpus is full of sizes and counts chosen to make a careless parser allocate
	// gigabytes; none of these images needs more than a few MiB to judge.
	maxCheckAlloc = 8 << 20
)

// A builder makes one image in dir and returns its path.
type builder func(t *testing.T, dir string) string

// An edit patches an image in place.
type edit func(t *testing.T, path string)

// corpusCase is one image and the verdict the engine must reach on it.
type corpusCase struct {
	name  string
	build builder
	opts  convert.OpenOptions
	// want lists the acceptable rejection reasons. Empty means the image is a valid
	// control: it must be accepted and convert to the same bytes as with qemu-img.
	want []reject.Reason
}

func reasons(r ...reject.Reason) []reject.Reason { return r }

// corpus is shared with TestWriteFuzzSeeds. Most hostile images follow QEMU's iotest 080:
// a valid image from qemu-img with one field patched.
var corpus = []corpusCase{
	// Valid controls, so that an engine rejecting everything cannot pass.
	{name: "control/qcow2-v3", build: plainQCOW2},
	{name: "control/qcow2-compat-0.10", build: qcow2WithData("-o", "compat=0.10")},
	{name: "control/qcow2-compressed", build: compressedQCOW2},
	{name: "control/iso-allowed", build: isoOnly, opts: convert.OpenOptions{AllowISO: true}},

	// An overlay: converting it would pull in whatever file the name resolves to.
	{name: "backing-file/relative", build: overlay("base.qcow2", "qcow2"), want: reasons(reject.BackingFile)},
	// An overlay whose backing file is a host secret, read out through the conversion.
	{name: "backing-file/etc-passwd", build: overlay("/etc/passwd", "raw"), want: reasons(reject.BackingFile)},
	// A backing reference with an empty name: the engine must not guess it is harmless.
	{name: "backing-file/offset-without-name", build: patched(plainQCOW2, setU64(offBackingOffset, 0x200)), want: reasons(reject.BackingFile)},
	// Guest data kept in a host file the image names.
	{name: "external-data-file", build: qcow2("-o", "data_file=DIR/data.raw"), want: reasons(reject.ExternalDataFile)},

	// Encrypted images cannot be validated or converted without the key.
	{name: "encrypted/qcow2-luks", build: qcow2("--object", "secret,id=s0,data=pw", "-o", "encrypt.format=luks,encrypt.key-secret=s0,encrypt.iter-time=200"), want: reasons(reject.Encrypted)},
	// Legacy AES: qemu 7.2 cannot create it any more, so set crypt_method by hand.
	{name: "encrypted/qcow2-aes", build: patched(plainQCOW2, setU32(offCryptMethod, 1)), want: reasons(reject.Encrypted)},
	{name: "encrypted/luks-container", build: luksContainer, want: reasons(reject.Encrypted)},

	// Feature bits whose meaning changes how the image must be read.
	{name: "feature/unknown-incompatible-bit", build: patched(plainQCOW2, setU64(offIncompatible, 1<<20)), want: reasons(reject.UnknownFeature)},
	{name: "feature/corrupt-bit", build: patched(plainQCOW2, setU64(offIncompatible, 1<<1)), want: reasons(reject.Corrupt)},
	{name: "feature/extended-l2", build: qcow2("-o", "extended_l2=on"), want: reasons(reject.ExtendedL2)},

	// Header fields out of range, aimed at reads past the header cluster or huge buffers.
	{name: "header/huge-header-length", build: patched(plainQCOW2, setU32(offHeaderLength, 0xffff_fff8)), want: reasons(reject.InvalidHeader)},
	{name: "header/header-length-not-multiple-of-8", build: patched(plainQCOW2, setU32(offHeaderLength, 108)), want: reasons(reject.InvalidHeader)},
	{name: "header/cluster-bits-8", build: patched(plainQCOW2, setU32(offClusterBits, 8)), want: reasons(reject.InvalidHeader)},
	{name: "header/cluster-bits-22", build: patched(plainQCOW2, setU32(offClusterBits, 22)), want: reasons(reject.InvalidHeader)},
	// 128-bit refcounts: the spec caps refcount_order at 6.
	{name: "header/refcount-order-7", build: patched(plainQCOW2, setU32(offRefcountOrder, 7)), want: reasons(reject.InvalidHeader)},

	// A header extension whose length runs past the first cluster, and one that is huge.
	{name: "header-extension/past-first-cluster", build: patched(plainQCOW2, setExtensionLength(0x1_0000)), want: reasons(reject.HeaderExtension)},
	{name: "header-extension/huge-length", build: patched(plainQCOW2, setExtensionLength(0x7fff_ffff)), want: reasons(reject.HeaderExtension)},

	// L1 tables sized or placed to make the reader allocate or seek wildly.
	{name: "l1/size-0xffffffff", build: patched(plainQCOW2, setU32(offL1Size, 0xffff_ffff)), want: reasons(reject.L1Table)},
	// One L1 entry maps 512 MiB at 64 KiB clusters; a 1 GiB disk needs two.
	{name: "l1/too-small-for-virtual-size", build: patched(plainQCOW2, setU64(offSize, 1<<30)), want: reasons(reject.L1Table)},
	{name: "l1/offset-past-eof", build: patched(plainQCOW2, setU64(offL1Offset, pastEOF)), want: reasons(reject.L1Table)},
	// Sector-aligned but not cluster-aligned, which the spec requires.
	{name: "l1/offset-unaligned", build: patched(plainQCOW2, moveL1(0x200)), want: reasons(reject.L1Table)},

	// Table entries pointing outside the file or off cluster boundaries.
	{name: "l2/table-past-eof", build: patched(plainQCOW2, setL1Entry0(flagCopied|pastEOF)), want: reasons(reject.L2Table)},
	{name: "l2/table-unaligned", build: patched(plainQCOW2, shiftL1Entry0(0x200)), want: reasons(reject.L2Table)},
	{name: "l2/data-cluster-past-eof", build: patched(plainQCOW2, setL2Entry0(flagCopied|pastEOF)), want: reasons(reject.L2Table)},
	{name: "l2/data-cluster-unaligned", build: patched(plainQCOW2, shiftL2Entry0(0x200)), want: reasons(reject.L2Table)},

	// Compressed clusters: a descriptor pointing past EOF, and a deflate stream that is
	// garbage (found only when the data is read, so this one needs the conversion).
	{name: "compressed/descriptor-past-eof", build: patched(compressedQCOW2, setL2Entry0(flagCompressed|pastEOF)), want: reasons(reject.CompressedCluster)},
	{name: "compressed/garbage-data", build: patched(compressedQCOW2, garbleCompressedCluster0), want: reasons(reject.CompressedCluster)},

	// Metadata tables the engine may never read, but must not trust either.
	{name: "refcount/table-huge", build: patched(plainQCOW2, setU32(offRefcountClusters, 0x7fff_ffff)), want: reasons(reject.RefcountTable)},
	{name: "refcount/table-past-eof", build: patched(plainQCOW2, setU64(offRefcountOffset, pastEOF)), want: reasons(reject.RefcountTable)},
	{name: "snapshots/count-huge", build: patched(plainQCOW2, setU32(offNbSnapshots, 0xffff_ffff)), want: reasons(reject.SnapshotTable)},
	{name: "snapshots/offset-unaligned", build: patched(plainQCOW2, setU32(offNbSnapshots, 1), setU64(offSnapshotsOffset, 0x200)), want: reasons(reject.SnapshotTable)},

	// Files cut short: inside the header, and just before the L1 table.
	{name: "truncated/50-bytes", build: patched(plainQCOW2, truncateTo(50)), want: reasons(reject.Truncated)},
	{name: "truncated/before-l1-table", build: patched(plainQCOW2, truncateAtL1), want: reasons(reject.Truncated, reject.L1Table)},

	// Formats imagepipe does not accept. The flat VMDK descriptor is the classic
	// host-file disclosure: a text file naming the host path to read the disk from.
	{name: "format/vmdk-flat-descriptor", build: vmdkDescriptor, want: reasons(reject.ExternalReference)},
	{name: "format/vmdk", build: qemuImage("vmdk"), want: reasons(reject.UnsupportedFormat)},
	{name: "format/vhd", build: qemuImage("vpc"), want: reasons(reject.UnsupportedFormat)},
	{name: "format/vhdx", build: qemuImage("vhdx"), want: reasons(reject.UnsupportedFormat)},
	{name: "format/vdi", build: qemuImage("vdi"), want: reasons(reject.UnsupportedFormat)},
	{name: "format/qed", build: qemuImage("qed"), want: reasons(reject.UnsupportedFormat)},
	// An ISO is only accepted when asked for (see control/iso-allowed).
	{name: "format/iso-by-default", build: isoOnly, want: reasons(reject.UnsupportedFormat)},

	// A file that is both an ISO and a qcow2: tools disagree on what it is.
	{name: "polyglot/iso-qcow2", build: patched(plainQCOW2, writeBytes(0x8001, []byte("CD001"))), want: reasons(reject.Polyglot)},

	// The declared format must match the content, both ways.
	{name: "mismatch/qcow2-declared-raw", build: plainQCOW2, opts: convert.OpenOptions{Format: convert.FormatRaw}, want: reasons(reject.FormatMismatch)},
	{name: "mismatch/raw-declared-qcow2", build: rawWithData, opts: convert.OpenOptions{Format: convert.FormatQCOW2}, want: reasons(reject.FormatMismatch)},

	// A tiny file promising a disk bigger than any storage it will be given.
	{name: "virtual-size/3TiB-default-limit", build: qcow2Sized("3T"), want: reasons(reject.VirtualSize)},
	{name: "virtual-size/over-caller-limit", build: qcow2Sized("10M"), opts: convert.OpenOptions{MaxVirtualSize: 1 << 20}, want: reasons(reject.VirtualSize)},
}

// TestHostileCorpus judges every corpus image the way an upload is judged and checks the
// verdict, and that judging stays within a small memory budget.
func TestHostileCorpus(t *testing.T) {
	testenv.RequireQEMU(t)
	for _, tc := range corpus {
		t.Run(tc.name, func(t *testing.T) {
			path := tc.build(t, t.TempDir())

			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			res, err := judge(t.Context(), path, tc.opts)
			runtime.ReadMemStats(&after)
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > maxCheckAlloc {
				t.Errorf("judging the image allocated %.1f MiB, want at most %d MiB", float64(alloc)/(1<<20), maxCheckAlloc>>20)
			}

			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("valid image rejected: %v", err)
				}
				if res.written != res.planned {
					t.Errorf("Write produced %d bytes, Plan.Size said %d", res.written, res.planned)
				}
				if want := qemuRawDigest(t, path); !bytes.Equal(res.digest, want) {
					t.Errorf("raw output differs from qemu-img convert -O raw (sha256 %x, qemu-img %x)", res.digest, want)
				}
				return
			}
			re := reject.As(err)
			if re == nil {
				t.Fatalf("got error %v, want a rejection for %v", err, tc.want)
			}
			t.Logf("%s: %s", re.Reason, re.Detail)
			if !slices.Contains(tc.want, re.Reason) {
				t.Errorf("rejected for %q, want %v (detail: %s)", re.Reason, tc.want, re.Detail)
			}
		})
	}
}

// judgement is what the engine produced for an accepted image.
type judgement struct {
	digest           []byte // SHA-256 of the raw output
	written, planned int64
}

// judge runs an image through every stage an upload goes through: Open (header checks), Verify
// (the walk over every L1 and L2 entry) and a conversion to raw, which reads, and so
// decompresses, every cluster. It returns the first error.
func judge(ctx context.Context, path string, opts convert.OpenOptions) (judgement, error) {
	f, err := os.Open(path)
	if err != nil {
		return judgement{}, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return judgement{}, err
	}
	img, err := convert.Open(f, fi.Size(), opts)
	if err != nil {
		return judgement{}, err
	}
	if _, err := img.Verify(ctx); err != nil {
		return judgement{}, err
	}
	p, err := img.Plan(ctx, convert.Options{To: convert.FormatRaw})
	if err != nil {
		return judgement{}, err
	}
	h := sha256.New()
	cw := &countingWriter{w: h}
	if err := p.Write(ctx, cw); err != nil {
		return judgement{}, err
	}
	return judgement{digest: h.Sum(nil), written: cw.n, planned: p.Size()}, nil
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}

// qemuRawDigest is the oracle: the SHA-256 of qemu-img's own conversion to raw.
func qemuRawDigest(t *testing.T, path string) []byte {
	t.Helper()
	out := filepath.Join(t.TempDir(), "oracle.raw")
	testenv.Run(t, "qemu-img", "convert", "-q", "-O", "raw", path, out)
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return sum[:]
}

// Builders.

// create runs qemu-img create for a disk of the given format and size, with extra arguments.
func create(t *testing.T, dir, format, size string, args ...string) string {
	t.Helper()
	p := filepath.Join(dir, "disk."+format)
	argv := []string{"create", "-q", "-f", format}
	for _, a := range args { // DIR/ names a file beside the image
		argv = append(argv, strings.ReplaceAll(a, "DIR/", dir+"/"))
	}
	argv = append(argv, p, size)
	// Creating a LUKS header times PBKDF iterations on the CPU, which
	// qemu-img sometimes cannot measure on a busy machine; try again then.
	for attempt := 1; ; attempt++ {
		out, err := exec.Command("qemu-img", argv...).CombinedOutput()
		if err == nil {
			return p
		}
		if attempt == 5 || !strings.Contains(string(out), "accurate CPU usage") {
			t.Fatalf("qemu-img %s: %v\n%s", strings.Join(argv, " "), err, out)
		}
	}
}

// writeData fills guest cluster 0 and one cluster further in, so the image has an L1
// entry, an L2 table and data clusters to aim at.
func writeData(t *testing.T, format, path string) {
	t.Helper()
	testenv.Run(t, "qemu-io", "-f", format, "-c", "write -P 0xaa 0 64k", "-c", "write -P 0x55 320k 64k", path)
}

// qcow2 is a 1 MiB qcow2 image made with the given qemu-img create arguments.
func qcow2(args ...string) builder {
	return func(t *testing.T, dir string) string { return create(t, dir, "qcow2", "1M", args...) }
}

// qcow2Sized is an empty qcow2 image of the given virtual size.
func qcow2Sized(size string) builder {
	return func(t *testing.T, dir string) string { return create(t, dir, "qcow2", size) }
}

// qcow2WithData is a 1 MiB qcow2 image with data clusters.
func qcow2WithData(args ...string) builder {
	return func(t *testing.T, dir string) string {
		p := create(t, dir, "qcow2", "1M", args...)
		writeData(t, "qcow2", p)
		return p
	}
}

// plainQCOW2 is a valid qcow2 v3 image with data clusters, the base of most patches.
func plainQCOW2(t *testing.T, dir string) string { return qcow2WithData()(t, dir) }

// rawWithData is a 1 MiB raw image with some non-zero data.
func rawWithData(t *testing.T, dir string) string {
	p := create(t, dir, "raw", "1M")
	writeData(t, "raw", p)
	return p
}

// compressedQCOW2 is a qcow2 image whose data clusters are all compressed.
func compressedQCOW2(t *testing.T, dir string) string {
	src := rawWithData(t, dir)
	p := filepath.Join(dir, "compressed.qcow2")
	testenv.Run(t, "qemu-img", "convert", "-q", "-c", "-f", "raw", "-O", "qcow2", src, p)
	return p
}

// overlay is a qcow2 image with the given backing file.
func overlay(backing, backingFormat string) builder {
	return func(t *testing.T, dir string) string {
		if !filepath.IsAbs(backing) {
			create(t, dir, backingFormat, "1M")
			if err := os.Rename(filepath.Join(dir, "disk."+backingFormat), filepath.Join(dir, backing)); err != nil {
				t.Fatal(err)
			}
		}
		return create(t, dir, "qcow2", "1M", "-b", backing, "-F", backingFormat)
	}
}

// luksContainer is a raw LUKS container (qemu's "luks" format).
func luksContainer(t *testing.T, dir string) string {
	return create(t, dir, "luks", "1M", "--object", "secret,id=s0,data=pw", "-o", "key-secret=s0,iter-time=200")
}

// qemuImage is an empty 1 MiB image in one of qemu's other formats.
func qemuImage(format string) builder {
	return func(t *testing.T, dir string) string { return create(t, dir, format, "1M") }
}

// vmdkDescriptor is a monolithicFlat VMDK descriptor whose extent is a host file.
func vmdkDescriptor(t *testing.T, dir string) string {
	p := filepath.Join(dir, "disk.vmdk")
	desc := "# Disk DescriptorFile\nversion=1\ncreateType=\"monolithicFlat\"\nRW 2048 FLAT \"/etc/shadow\" 0\n"
	if err := os.WriteFile(p, []byte(desc), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// isoOnly is a 1 MiB file whose only structure is an ISO 9660 volume descriptor identifier.
func isoOnly(t *testing.T, dir string) string {
	p := create(t, dir, "raw", "1M")
	writeBytes(0x8001, []byte("CD001"))(t, p)
	return p
}

// Edits.

// patched builds base and then applies the edits in order.
func patched(base builder, edits ...edit) builder {
	return func(t *testing.T, dir string) string {
		p := base(t, dir)
		for _, e := range edits {
			e(t, p)
		}
		return p
	}
}

func writeBytes(off int64, b []byte) edit {
	return func(t *testing.T, path string) {
		t.Helper()
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
	}
}

func setU32(off int64, v uint32) edit { return writeBytes(off, binary.BigEndian.AppendUint32(nil, v)) }
func setU64(off int64, v uint64) edit { return writeBytes(off, binary.BigEndian.AppendUint64(nil, v)) }

func readU32(t *testing.T, path string, off int64) uint32 {
	return binary.BigEndian.Uint32(readAt(t, path, off, 4))
}

func readU64(t *testing.T, path string, off int64) uint64 {
	return binary.BigEndian.Uint64(readAt(t, path, off, 8))
}

func readAt(t *testing.T, path string, off, n int64) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatalf("reading %d bytes at %d of %s: %v", n, off, path, err)
	}
	return b
}

// setExtensionLength sets the length of the first header extension, which starts at
// header_length.
func setExtensionLength(v uint32) edit {
	return func(t *testing.T, path string) {
		setU32(int64(readU32(t, path, offHeaderLength))+4, v)(t, path)
	}
}

// moveL1 adds delta to l1_table_offset.
func moveL1(delta uint64) edit {
	return func(t *testing.T, path string) {
		setU64(offL1Offset, readU64(t, path, offL1Offset)+delta)(t, path)
	}
}

// l1Entry0 is the file offset of the L1 entry for guest cluster 0.
func l1Entry0(t *testing.T, path string) int64 { return int64(readU64(t, path, offL1Offset)) }

// l2Entry0 is the file offset of the L2 entry for guest cluster 0.
func l2Entry0(t *testing.T, path string) int64 {
	t.Helper()
	l2 := readU64(t, path, l1Entry0(t, path)) & offsetMask
	if l2 == 0 {
		t.Fatalf("%s: guest cluster 0 has no L2 table", path)
	}
	return int64(l2)
}

func setL1Entry0(v uint64) edit {
	return func(t *testing.T, path string) { setU64(l1Entry0(t, path), v)(t, path) }
}

func setL2Entry0(v uint64) edit {
	return func(t *testing.T, path string) { setU64(l2Entry0(t, path), v)(t, path) }
}

// shiftL1Entry0 moves the L2 table pointer of guest cluster 0 by delta bytes.
func shiftL1Entry0(delta uint64) edit {
	return func(t *testing.T, path string) {
		off := l1Entry0(t, path)
		setU64(off, readU64(t, path, off)+delta)(t, path)
	}
}

// shiftL2Entry0 moves the data cluster pointer of guest cluster 0 by delta bytes.
func shiftL2Entry0(delta uint64) edit {
	return func(t *testing.T, path string) {
		off := l2Entry0(t, path)
		e := readU64(t, path, off)
		if e&offsetMask == 0 {
			t.Fatalf("%s: guest cluster 0 is not allocated", path)
		}
		setU64(off, e+delta)(t, path)
	}
}

// garbleCompressedCluster0 overwrites the deflate stream of compressed guest cluster 0
// with 0xff bytes. The descriptor stays valid, so only decompression can notice.
func garbleCompressedCluster0(t *testing.T, path string) {
	e := readU64(t, path, l2Entry0(t, path))
	if e&flagCompressed == 0 {
		t.Fatalf("%s: guest cluster 0 is not compressed (L2 entry %#x)", path, e)
	}
	// Compressed descriptor: host offset in bits 0..x-1, additional 512-byte sectors in
	// bits x..61, where x = 62 - (cluster_bits - 8).
	x := 62 - (readU32(t, path, offClusterBits) - 8)
	off := int64(e & (1<<x - 1))
	sectors := int64(e>>x) & (1<<(62-x) - 1)
	n := (sectors+1)*512 - off%512
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	n = min(n, fi.Size()-off)
	writeBytes(off, bytes.Repeat([]byte{0xff}, int(n)))(t, path)
}

func truncateTo(size int64) edit {
	return func(t *testing.T, path string) {
		if err := os.Truncate(path, size); err != nil {
			t.Fatal(err)
		}
	}
}

// truncateAtL1 cuts the file where its L1 table starts.
func truncateAtL1(t *testing.T, path string) { truncateTo(l1Entry0(t, path))(t, path) }
