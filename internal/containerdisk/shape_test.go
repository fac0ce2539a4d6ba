package containerdisk

import (
	"archive/tar"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/imagepipe/imagepipe/internal/convert"
	"github.com/imagepipe/imagepipe/internal/reject"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// TestHeadReaderAt: the head serves its bytes and records a read past them.
func TestHeadReaderAt(t *testing.T) {
	h := &headReaderAt{head: []byte("0123456789")}
	buf := make([]byte, 4)
	if n, err := h.ReadAt(buf, 2); n != 4 || err != nil || h.beyond {
		t.Errorf("inside the head: %d, %v", n, err)
	}
	if n, err := h.ReadAt(buf, 8); n != 2 || !errors.Is(err, errBeyondHead) || !h.beyond {
		t.Errorf("across the end of the head: %d, %v", n, err)
	}
}

// FuzzDiskEntry checks the containerDisk shape check and the head read
// against their rules. Each input builds a layer from fuzzed tar headers
// (names, types, owner, mode, size) and disk bytes (zeros after data, up
// to size, never materialised beyond the head): diskEntry's verdict must
// be exactly the one the rules give for the headers as a tar reader reads
// them back (which reason, or acceptance), and an accepted disk's head
// must be exactly its first 64 KiB, or its first cluster (up to 2 MiB)
// when it starts with a qcow2 header, never more than the disk. Arbitrary
// tar bytes (raw) are also fed in as they are: whatever diskEntry accepts
// has the containerDisk shape, and the head read stays within 2 MiB and
// the declared size. Nothing may panic.
func FuzzDiskEntry(f *testing.F) {
	qcowHead := func(bits byte) []byte {
		b := make([]byte, 104)
		copy(b, "QFI\xfb\x00\x00\x00\x03")
		b[23] = bits
		return b
	}
	f.Add(api.DiskDir, byte(tar.TypeDir), api.DiskPath, byte(tar.TypeReg), 107, 107, int64(0o444), int64(1000), []byte("imagepipe"), []byte(nil))
	// Heads of 256 KiB: a seed with 2 MiB clusters would make most
	// executions copy megabytes (TestReadDiskHeadSizes covers those).
	f.Add(api.DiskDir, byte(tar.TypeDir), api.DiskPath, byte(tar.TypeReg), 107, 107, int64(0o444), int64(300<<10), qcowHead(18), []byte(nil))
	f.Add(api.DiskDir, byte(tar.TypeDir), api.DiskPath, byte(tar.TypeReg), 107, 107, int64(0o444), int64(100<<10), qcowHead(16), []byte(nil))
	f.Add(api.DiskDir, byte(tar.TypeDir), api.DiskPath, byte(tar.TypeSymlink), 107, 107, int64(0o444), int64(0), []byte(nil), []byte(nil))
	f.Add("disk", byte(tar.TypeDir), "disk/other.img", byte(tar.TypeReg), 0, 0, int64(0o666), int64(10), []byte(nil), []byte(nil))
	// The owner's halves apart: each is checked on its own.
	f.Add(api.DiskDir, byte(tar.TypeDir), api.DiskPath, byte(tar.TypeReg), 107, 0, int64(0o444), int64(1000), []byte(nil), []byte(nil))
	f.Add(api.DiskDir, byte(tar.TypeDir), api.DiskPath, byte(tar.TypeReg), 0, 107, int64(0o444), int64(1000), []byte(nil), []byte(nil))
	f.Fuzz(checkDiskEntry)
}

// paxBeyondSizeAndTimes reports whether h carries a PAX record other than
// the size, the times and the owner names, which a containerDisk's
// entries may not.
func paxBeyondSizeAndTimes(h *tar.Header) bool {
	for k := range h.PAXRecords {
		switch k {
		case "size", "mtime", "atime", "ctime", "uname", "gname":
		default:
			return true
		}
	}
	return false
}

// checkDiskEntry is FuzzDiskEntry's check of one input.
func checkDiskEntry(t *testing.T, dirName string, dirType byte, fileName string, fileType byte, uid, gid int, mode, size int64, data, raw []byte) {
	{
		if len(raw) > 0 {
			checkRawDiskEntry(t, raw)
		}
		size &= 4<<20 - 1 // up to 4 MiB: past the 2 MiB head limit
		var hdrs bytes.Buffer
		tw := tar.NewWriter(&hdrs)
		if tw.WriteHeader(&tar.Header{Name: dirName, Typeflag: dirType, Mode: 0o555, Uid: api.DiskUID, Gid: api.DiskGID}) != nil ||
			tw.WriteHeader(&tar.Header{Name: fileName, Typeflag: fileType, Mode: mode, Uid: uid, Gid: gid, Size: size}) != nil {
			return // not a header archive/tar writes
		}
		if int64(len(data)) > size {
			data = data[:size]
		}
		content := func() io.Reader {
			return io.MultiReader(bytes.NewReader(data), io.LimitReader(zeroReader{}, size-int64(len(data))))
		}

		// The rules, applied to the headers as read back.
		want, wantErr := reject.Reason(""), false
		rd := tar.NewReader(bytes.NewReader(hdrs.Bytes()))
		dir, err := rd.Next()
		var file *tar.Header
		if err == nil && dir.Name == api.DiskDir && dir.Typeflag == tar.TypeDir {
			file, err = rd.Next()
		}
		switch {
		case err != nil && !errors.Is(err, io.EOF):
			wantErr = true
		case dir == nil || dir.Name != api.DiskDir || dir.Typeflag != tar.TypeDir:
			want = reject.TarEntry
		case file == nil || file.Name != api.DiskPath || file.Typeflag != tar.TypeReg:
			want = reject.TarEntry
		case paxBeyondSizeAndTimes(file):
			want = reject.TarEntry // a negative or huge uid, say, is a PAX record
		case file.Uid != api.DiskUID || file.Gid != api.DiskGID:
			want = reject.DiskOwner
		case file.Mode&0o7777 != 0o444:
			want = reject.DiskMode
		}

		tr := tar.NewReader(io.MultiReader(bytes.NewReader(hdrs.Bytes()), content()))
		h, err := diskEntry(tr)
		se := reject.As(err)
		if se != nil && !se.Reason.IsShape() {
			se = nil
		}
		switch {
		case wantErr:
			if err == nil || se != nil {
				t.Fatalf("headers a tar reader refuses: diskEntry = %v", err)
			}
			return
		case want != "":
			if se == nil || se.Reason != want {
				t.Fatalf("dir %q (%q), file %q (%q) %d:%d %o: diskEntry = %v, want reason %s", dirName, dirType, fileName, fileType, uid, gid, mode, err, want)
			}
			return
		case err != nil:
			t.Fatalf("dir %q, file %q %d:%d %o: diskEntry = %v, want acceptance", dirName, fileName, uid, gid, mode, err)
		}
		if h.Size != size {
			t.Fatalf("header size %d, want %d", h.Size, size)
		}

		head, err := readDiskHead(tr, h.Size)
		if err != nil {
			t.Fatalf("reading the head of a %d-byte disk: %v", size, err)
		}
		wantLen := min(size, convert.ProbeSize)
		if len(data) >= 24 && wantLen >= 24 && string(data[:4]) == "QFI\xfb" {
			if bits := binary.BigEndian.Uint32(data[20:24]); bits > 16 && bits <= 21 {
				wantLen = min(size, 1<<bits)
			}
		}
		if int64(len(head)) != wantLen || len(head) > 2<<20 {
			t.Fatalf("head of %d bytes, want %d", len(head), wantLen)
		}
		n := min(len(data), len(head))
		if !bytes.Equal(head[:n], data[:n]) || slices.ContainsFunc(head[n:], func(b byte) bool { return b != 0 }) {
			t.Fatal("the head is not the disk's first bytes")
		}
		convert.Open(&headReaderAt{head: head}, h.Size, convert.OpenOptions{AllowISO: true})
	}
}

// TestDiskOwnerIsQemuUserAndGroup: KubeVirt's qemu runs as 107:107 and
// reads disk/disk.img as that user, so a disk whose uid or whose gid alone
// is not 107 is refused as a disk-owner rejection that names the owner
// found; 107:107 is accepted.
func TestDiskOwnerIsQemuUserAndGroup(t *testing.T) {
	disk := make([]byte, 4096)
	for _, tc := range []struct {
		name     string
		uid, gid int
		want     reject.Reason // "" for acceptance
		owner    string        // what the rejection must name
	}{
		{"the qemu user and group", api.DiskUID, api.DiskGID, "", ""},
		{"the right uid and gid 0", api.DiskUID, 0, reject.DiskOwner, "107:0"},
		{"the right uid and gid 1000", api.DiskUID, 1000, reject.DiskOwner, "107:1000"},
		{"uid 0 and the right gid", 0, api.DiskGID, reject.DiskOwner, "0:107"},
		{"uid 1000 and the right gid", 1000, api.DiskGID, reject.DiskOwner, "1000:107"},
		{"root", 0, 0, reject.DiskOwner, "0:0"},
		{"neither is 107", api.DiskUID + 1, api.DiskGID - 1, reject.DiskOwner, "108:106"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			blob := diskTar(t, disk, func(h *tar.Header) { h.Uid, h.Gid = tc.uid, tc.gid }, nil)
			err := readLayer(t, ocispec.MediaTypeImageLayer, blob)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("owned by %d:%d: %v; want acceptance", tc.uid, tc.gid, err)
				}
				return
			}
			re := reject.As(err)
			if re == nil || re.Reason != tc.want {
				t.Fatalf("owned by %d:%d: %v; want a %s rejection", tc.uid, tc.gid, err, tc.want)
			}
			if !strings.Contains(err.Error(), "owned by "+tc.owner) {
				t.Errorf("the rejection %q does not name the owner %s", err, tc.owner)
			}
		})
	}
}

// TestReadDiskHeadSizes: the head is the first 64 KiB, or the whole first
// cluster of a qcow2 image with clusters of 128 KiB to 2 MiB, never more
// than the disk.
func TestReadDiskHeadSizes(t *testing.T) {
	for _, tc := range []struct {
		bits       byte
		size, want int64
	}{
		{16, 4 << 20, 64 << 10}, {17, 4 << 20, 128 << 10}, {21, 4 << 20, 2 << 20}, {21, 1 << 20, 1 << 20},
		{22, 4 << 20, 64 << 10}, {9, 4 << 20, 64 << 10}, {21, 100, 100},
	} {
		disk := make([]byte, tc.size)
		copy(disk, "QFI\xfb\x00\x00\x00\x03")
		if len(disk) > 23 {
			disk[23] = tc.bits
		}
		head, err := readDiskHead(bytes.NewReader(disk), tc.size)
		if err != nil || int64(len(head)) != tc.want || !bytes.Equal(head, disk[:tc.want]) {
			t.Errorf("cluster bits %d, %d-byte disk: %d bytes, %v; want %d", tc.bits, tc.size, len(head), err, tc.want)
		}
	}
}

// checkRawDiskEntry runs the shape check and head read on raw tar bytes.
func checkRawDiskEntry(t *testing.T, raw []byte) {
	r := bytes.NewReader(raw)
	tr := tar.NewReader(r)
	h, err := diskEntry(tr)
	if err != nil {
		return
	}
	if h.Name != api.DiskPath || h.Typeflag != tar.TypeReg || h.Uid != api.DiskUID || h.Gid != api.DiskGID || h.Mode&0o7777 != 0o444 {
		t.Fatalf("diskEntry accepted %+v", h)
	}
	checkRawHeaders(raw[:len(raw)-r.Len()], h) // any answer, and no panic
	head, err := readDiskHead(tr, h.Size)
	if err != nil {
		return
	}
	if len(head) > 2<<20 || int64(len(head)) > h.Size {
		t.Fatalf("read %d bytes of head of a %d-byte disk", len(head), h.Size)
	}
	convert.Open(&headReaderAt{head: head}, h.Size, convert.OpenOptions{AllowISO: true})
}

// zeroReader reads zeros.
type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
