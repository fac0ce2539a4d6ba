package containerdisk

import (
	"archive/tar"
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/klauspost/compress/zstd"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/imagepipe/imagepipe/internal/reject"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// isShapeError reports whether err is a rejection of the containerDisk's
// shape (as opposed to the disk inside it).
func isShapeError(err error) bool {
	re := reject.As(err)
	return re != nil && re.Reason.IsShape()
}

// zstdMaxWindow bounds the memory a layer's zstd stream may ask for, as
// the disk engine's unwrapping does.
const zstdMaxWindow = 128 << 20

// Docker's layer media types, which a containerDisk may also have.
const (
	dockerLayerGzip = "application/vnd.docker.image.rootfs.diff.tar.gzip"
	dockerLayer     = "application/vnd.docker.image.rootfs.diff.tar"
)

// Layer compressions as the layer's first bytes show them. CDI's importer
// decides by these bytes, not by the media type, so a layer whose content
// and media type disagree has two readings and is refused.
const (
	contentTar  = "tar"
	contentGzip = "gzip"
	contentZstd = "zstd"
)

// sniffLayer names the compression the first bytes of a layer show:
// gzip, zstd, or none (a tar). Any other compression magic is refused,
// since a reader that sniffs would decompress what a tar reader takes as
// data.
func sniffLayer(head []byte) (string, error) {
	switch {
	case bytes.HasPrefix(head, []byte{0x1f, 0x8b}):
		return contentGzip, nil
	case bytes.HasPrefix(head, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		return contentZstd, nil
	case bytes.HasPrefix(head, []byte{0xfd, '7', 'z', 'X', 'Z', 0}):
		return "", reject.New(reject.LayerMediaType, "the layer is xz-compressed; a containerDisk layer is a tar, gzip or zstd")
	case bytes.HasPrefix(head, []byte("BZh")):
		return "", reject.New(reject.LayerMediaType, "the layer is bzip2-compressed; a containerDisk layer is a tar, gzip or zstd")
	case len(head) >= 4 && binary.LittleEndian.Uint32(head)&0xFFFFFFF0 == 0x184D2A50:
		return "", reject.New(reject.LayerMediaType, "the layer starts with a zstd skippable frame; a containerDisk layer starts with its data")
	}
	return contentTar, nil
}

// mediaTypeContent is the compression a layer media type declares.
func mediaTypeContent(mt string) (string, error) {
	switch mt {
	case ocispec.MediaTypeImageLayerGzip, dockerLayerGzip:
		return contentGzip, nil
	case ocispec.MediaTypeImageLayerZstd:
		return contentZstd, nil
	case ocispec.MediaTypeImageLayer, dockerLayer:
		return contentTar, nil
	}
	return "", reject.New(reject.LayerMediaType, "the layer's media type %q is not a tar, gzip or zstd layer", mt)
}

// decompressLayer returns the tar stream of a layer of the given media
// type, whose content must show the same compression (sniffLayer).
// A gzip layer may be several members, read as one stream as CDI's
// importer and gzip -d read them; bytes after the last member are refused.
// A gzip member's header costs what its fields hold, within limits the
// reader sets: FEXTRA at most 64 KiB (its length is 16 bits; imagectl's
// own small layers carry 500 bytes of it, see gzipPadder), a name or
// comment at most 512 bytes.
//
// A zstd layer may be several frames, skippable ones among them but not
// first (sniffLayer), with windows up to zstdMaxWindow, and is decoded on
// one goroutine. Its first block may end anywhere: CDI's importer up to
// v1.66 misreads a stream whose first block ends before byte cdiPeekSize
// (see zstdWriter), but the gate keeps a pushed layer only in imagepipe's
// framing (streamFraming.own), whose first block ends past it, and writes
// any other anew, so CDI never reads such a stream.
//
// stream records the gzip stream's first header and its reader's member
// count (streamFraming).
func decompressLayer(mt string, r *bufio.Reader, stream *streamFraming) (io.ReadCloser, error) {
	declared, err := mediaTypeContent(mt)
	if err != nil {
		return nil, err
	}
	head, err := r.Peek(6)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	found, err := sniffLayer(head)
	if err != nil {
		return nil, err
	}
	if found != declared {
		return nil, reject.New(reject.LayerMediaType, "the layer's media type %q declares %s but its bytes are %s; importers that look at the bytes would read another layer", mt, declared, found)
	}
	switch found {
	case contentGzip:
		start, err := r.Peek(gzipPaddedHeaderSize)
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, err
		}
		stream.gzip = classifyGzipStart(start)
		zr, err := newGzipReader(r)
		if err != nil {
			return nil, fmt.Errorf("opening the gzip layer: %w", err)
		}
		stream.members, _ = zr.(gzipMembers)
		return zr, nil
	case contentZstd:
		zr, err := zstd.NewReader(r, zstd.WithDecoderMaxWindow(zstdMaxWindow), zstd.WithDecoderConcurrency(1))
		if err != nil {
			return nil, fmt.Errorf("opening the zstd layer: %w", err)
		}
		return zr.IOReadCloser(), nil
	}
	return io.NopCloser(r), nil
}

// allowedPAX are the PAX records a disk entry may carry: Go's tar writer
// adds "size" for disks of 8 GiB and more; times and owner names change
// nothing, since the owner is the numeric one (and the canonical layer
// has neither). Any other record (a path, a link, a numeric owner, a GNU
// sparse map, extended attributes) changes what the entry means to some
// readers and not to others.
var allowedPAX = map[string]bool{"size": true, "mtime": true, "atime": true, "ctime": true, "uname": true, "gname": true}

// tarBlockSize is the size of a tar header and the unit of its data.
const tarBlockSize = 512

// checkRawHeaders walks the header blocks of head, the tar's bytes before
// the disk's first byte (already read by archive/tar), and refuses what a
// reader without PAX or GNU extensions would read as another tar: a GNU
// long-name or long-link header (such a reader sees the entry under its
// raw name, and the header as one more file), a directory whose header
// declares data, and a PAX size record that the disk's non-zero ustar
// size field contradicts. file is the disk's header.
func checkRawHeaders(head []byte, file *tar.Header) error {
	if head == nil {
		return reject.New(reject.TarEntry, "the layer's tar headers are over %d bytes; a containerDisk's take a few blocks", maxFraming)
	}
	gnu := false // a GNU long-name or long-link header came before the entry
	for off := 0; off+tarBlockSize <= len(head); {
		blk := head[off : off+tarBlockSize]
		off += tarBlockSize
		size, sizeOK := octalField(blk[124:136])
		switch blk[156] {
		case tar.TypeGNULongName, tar.TypeGNULongLink, tar.TypeXHeader:
			if !sizeOK {
				return reject.New(reject.TarEntry, "an extended header of the layer's tar has the size field %q", blk[124:136])
			}
			gnu = gnu || blk[156] != tar.TypeXHeader
			off += int((size + tarBlockSize - 1) / tarBlockSize * tarBlockSize)
			continue
		}
		name := rawName(blk)
		if gnu {
			return reject.New(reject.TarEntry, "a GNU long-name or long-link header renames or links the entry whose raw name is %q; a reader without GNU extensions sees that name, and the header as one more file", name)
		}
		if off < len(head) && (!sizeOK || size != 0) {
			return reject.New(reject.TarEntry, "the directory %q declares data (size field %q); a reader that skips it takes %s's header for it", name, bytes.Trim(blk[124:136], "\x00"), api.DiskPath)
		}
		if _, pax := file.PAXRecords["size"]; off == len(head) && pax && (!sizeOK || size != 0 && size != file.Size) {
			return reject.New(reject.TarEntry, "%s has a PAX size record of %d bytes but its ustar size field says %q; a reader without PAX reads another file", api.DiskPath, file.Size, bytes.Trim(blk[124:136], "\x00"))
		}
	}
	return nil
}

// octalField parses a tar header's octal number field as archive/tar
// does (spaces and NULs around it ignored); base-256 is not taken.
func octalField(b []byte) (int64, bool) {
	s := strings.Trim(string(b), " \x00")
	if s == "" {
		return 0, true
	}
	n, err := strconv.ParseInt(s, 8, 64)
	return n, err == nil && n >= 0
}

// rawName is the name a header block gives its entry, as a reader without
// PAX or GNU extensions reads it: the ustar prefix, if any, and the name.
func rawName(blk []byte) string {
	cstr := func(b []byte) string {
		if i := bytes.IndexByte(b, 0); i >= 0 {
			b = b[:i]
		}
		return string(b)
	}
	name := cstr(blk[0:100])
	if string(blk[257:263]) == "ustar\x00" {
		if prefix := cstr(blk[345:500]); prefix != "" {
			name = prefix + "/" + name
		}
	}
	return name
}

// checkPAX refuses a header whose PAX records could be read two ways.
func checkPAX(h *tar.Header) error {
	for k := range h.PAXRecords {
		if !allowedPAX[k] {
			return reject.New(reject.TarEntry, "the entry %q carries the PAX record %q; a containerDisk's entries carry none but size, times and owner names", h.Name, k)
		}
	}
	return nil
}

// diskEntry reads the layer's tar headers up to disk/disk.img and checks
// the containerDisk shape: the directory disk/ first, then the regular file
// disk/disk.img, 0444 and owned 107:107. The tar reader is left at the
// start of the file's contents.
func diskEntry(tr *tar.Reader) (*tar.Header, error) {
	dir, err := tr.Next()
	if errors.Is(err, io.EOF) {
		return nil, reject.New(reject.TarEntry, "the layer is an empty tar; it must hold %s and %s", api.DiskDir, api.DiskPath)
	}
	if err != nil {
		return nil, err
	}
	if err := checkPAX(dir); err != nil {
		return nil, err
	}
	if dir.Name != api.DiskDir || dir.Typeflag != tar.TypeDir {
		return nil, reject.New(reject.TarEntry, "the layer's first entry is %q (%s); a containerDisk starts with the directory %s", dir.Name, typeName(dir.Typeflag), api.DiskDir)
	}
	file, err := tr.Next()
	if errors.Is(err, io.EOF) {
		return nil, reject.New(reject.TarEntry, "the layer holds only %s; %s is missing", api.DiskDir, api.DiskPath)
	}
	if err != nil {
		return nil, err
	}
	if err := checkPAX(file); err != nil {
		return nil, err
	}
	if file.Name != api.DiskPath || file.Typeflag != tar.TypeReg {
		return nil, reject.New(reject.TarEntry, "the layer's second entry is %q (%s); a containerDisk holds only the regular file %s", file.Name, typeName(file.Typeflag), api.DiskPath)
	}
	if file.Uid != api.DiskUID || file.Gid != api.DiskGID {
		return nil, reject.New(reject.DiskOwner, "%s is owned by %d:%d; KubeVirt reads it as %d:%d", api.DiskPath, file.Uid, file.Gid, api.DiskUID, api.DiskGID)
	}
	if mode := file.Mode & 0o7777; mode != 0o444 {
		return nil, reject.New(reject.DiskMode, "%s has mode %04o; it must be 0444", api.DiskPath, mode)
	}
	return file, nil
}

func typeName(t byte) string {
	switch t {
	case tar.TypeReg:
		return "file"
	case tar.TypeDir:
		return "directory"
	case tar.TypeSymlink:
		return "symlink"
	case tar.TypeLink:
		return "hard link"
	}
	return fmt.Sprintf("type %q", t)
}

// trackedReader remembers the error of the stream it reads, so that a
// failure further up (decompression, tar) can be told apart from a broken
// download: only the former says something about the image.
type trackedReader struct {
	r   io.Reader
	err error
}

func (t *trackedReader) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		t.err = err
	}
	return n, err
}

// layerError turns an error met while reading a layer into a shape
// rejection when the layer's bytes, not their transfer, are at fault.
func layerError(err error, src *trackedReader) error {
	switch {
	case err == nil:
		return nil
	case src.err != nil:
		return fmt.Errorf("reading the layer: %w", src.err)
	case isShapeError(err):
		return err
	}
	return reject.New(reject.InvalidLayer, "the layer is not a valid tar stream: %v", err)
}

// errBeyondHead is what headReaderAt returns for bytes it does not hold.
// It matches io.EOF, so the disk engine's header checks see the disk as
// ending there: they then validate what the head holds, and headReaderAt
// records that something further was asked for.
var errBeyondHead = fmt.Errorf("the disk's bytes past its first cluster were not read: %w", io.EOF)

// headReaderAt serves the first bytes of a disk whose full size is known
// (the tar header says it), without the rest.
type headReaderAt struct {
	head []byte
	// beyond is set once a read reached past head.
	beyond bool
}

func (h *headReaderAt) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, errors.New("negative offset")
	}
	if off >= int64(len(h.head)) {
		h.beyond = true
		return 0, errBeyondHead
	}
	n := copy(p, h.head[off:])
	if n < len(p) {
		h.beyond = true
		return n, errBeyondHead
	}
	return n, nil
}
