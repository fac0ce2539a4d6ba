package containerdisk

import (
	"archive/tar"
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/imagepipe/imagepipe/internal/convert"
	"github.com/imagepipe/imagepipe/internal/reject"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// CheckLayerCount rejects an image that does not have exactly one layer.
func CheckLayerCount(n int) error {
	if n != 1 {
		return reject.New(reject.LayerCount, "the image has %d layers; a containerDisk has exactly one", n)
	}
	return nil
}

// LayerReader reads a containerDisk layer as it streams in: its tar
// headers up to disk/disk.img are checked when it is opened, then either
// the disk's head (CheckHead) or the whole disk (CopyDisk) is read. Errors
// of the blob's stream (a broken download) stay errors; anything wrong
// with the bytes themselves is a *reject.Error (a shape or a disk reason).
type LayerReader struct {
	src    *trackedReader
	stream *streamFraming // sees src's bytes as buf reads them
	buf    *bufio.Reader  // src, read ahead; what the decompressor reads
	zr     io.ReadCloser
	diff   *asyncHash
	frame  *framing
	tarIn  io.Reader
	tr     *tar.Reader
	file   *tar.Header
	ended  bool // CopyDisk read the whole layer
}

// OpenLayer starts reading the layer blob of media type mediaType and
// checks its shape up to the disk's first byte. The caller closes the
// reader, and blob, which is not read further than asked.
func OpenLayer(mediaType string, blob io.Reader) (*LayerReader, error) {
	src := &trackedReader{r: blob}
	stream := newStreamFraming(mediaType)
	buf := bufio.NewReaderSize(io.TeeReader(src, stream), 128<<10) // holds any gzip header Go reads
	zr, err := decompressLayer(mediaType, buf, stream)
	if err != nil {
		return nil, layerError(err, src)
	}
	l := &LayerReader{src: src, stream: stream, buf: buf, zr: zr, diff: newAsyncHash(sha256.New()), frame: &framing{disk: -1}}
	l.tarIn = io.TeeReader(zr, io.MultiWriter(l.diff, l.frame))
	l.tr = tar.NewReader(l.tarIn)
	if l.file, err = diskEntry(l.tr); err != nil {
		l.Close()
		return nil, layerError(err, src)
	}
	// archive/tar reads a header's blocks and nothing more: what passed
	// so far is all the tar holds before the disk's first byte.
	l.frame.disk = l.file.Size
	if err := checkRawHeaders(l.Head(), l.file); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// OwnCompressionFraming reports whether the layer's compression framing
// is what imagepipe's writers emit: for gzip the member headers (padding
// included) and their count, for zstd the frames and their headers, and
// nothing after the last. The coded data inside (deflate or zstd blocks)
// is not compared: it is the build's compressor's, and the decoder checks
// every byte of it. Before CopyDisk has returned it speaks of the bytes
// read so far (false: the layer is not one imagepipe wrote); once
// CopyDisk has returned without an error, of the whole layer. A layer
// that is not compressed reports true.
func (l *LayerReader) OwnCompressionFraming() bool {
	return l.stream.own(l.ended, l.frame.total)
}

// Head is the tar's bytes before the disk's first byte, as read; nil when
// they are more than maxFraming.
func (l *LayerReader) Head() []byte {
	if l.frame.overflow {
		return nil
	}
	return l.frame.head
}

// Tail is the tar's bytes after the disk's last byte, the end marker and
// any padding after it, once CopyDisk has read them; nil when they are
// more than maxFraming.
func (l *LayerReader) Tail() []byte {
	if l.frame.overflow {
		return nil
	}
	return l.frame.tail
}

// maxFraming bounds the bytes framing keeps on each side of the disk:
// imagepipe's own headers and end marker are a few KiB.
const maxFraming = 64 << 10

// framing keeps the tar's bytes before and after the disk, as they pass,
// and counts them all.
type framing struct {
	disk       int64 // disk bytes still to pass; -1 while the headers are read
	head, tail []byte
	overflow   bool
	total      int64
}

func (f *framing) Write(p []byte) (int, error) {
	n := len(p)
	f.total += int64(n)
	if f.disk < 0 {
		f.head = f.keep(f.head, p)
		return n, nil
	}
	k := int(min(int64(len(p)), f.disk))
	f.disk -= int64(k)
	f.tail = f.keep(f.tail, p[k:])
	return n, nil
}

func (f *framing) keep(b, p []byte) []byte {
	if len(b)+len(p) > maxFraming {
		f.overflow = true
		return b
	}
	return append(b, p...)
}

// Close releases the decompressor and the tar's hash.
func (l *LayerReader) Close() error {
	l.diff.close()
	return l.zr.Close()
}

// DiskSize is the size of disk/disk.img its tar header declares.
func (l *LayerReader) DiskSize() int64 { return l.file.Size }

// CheckHead reads the disk's first cluster and runs the disk engine's
// header checks against the declared size; the L1/L2 tables and data are
// not read. The format the annotations declare is the one the disk must
// have (an ISO imported with --allow-iso is stored as raw and was accepted
// then), and a virtual size annotation must match the disk's. It fills the
// disk fields of report (DiskSize, DiskFormat, VirtualSize, Checked).
func (l *LayerReader) CheckHead(annotations map[string]string, report *api.ContainerDiskReport) error {
	report.DiskSize = l.file.Size
	head, err := readDiskHead(l.tr, l.file.Size)
	if err != nil {
		return layerError(err, l.src)
	}
	hr := &headReaderAt{head: head}
	if det, err := convert.Detect(hr, l.file.Size); err == nil {
		report.DiskFormat = string(det.Format)
	}
	opts := convert.OpenOptions{Format: convert.Format(annotations[api.AnnotationDiskFormat]), AllowISO: true}
	disk, err := convert.Open(hr, l.file.Size, opts)
	if err != nil {
		return err
	}
	info := disk.Info()
	report.DiskFormat = string(info.Format)
	report.VirtualSize = info.VirtualSize
	if s, ok := annotations[api.AnnotationVirtualSize]; ok {
		if n, err := strconv.ParseInt(s, 10, 64); err != nil || n != info.VirtualSize {
			return reject.New(reject.AnnotationMismatch, "the annotation %s is %q but the disk's virtual size is %d bytes", api.AnnotationVirtualSize, s, info.VirtualSize)
		}
	}
	report.Checked = api.CheckedHeader
	return nil
}

// CopyDisk copies disk/disk.img to w, checks that nothing follows it in
// the layer and reads the blob to its end (so that whoever verifies the
// blob's digest sees all of it). It returns the layer's diff ID, the
// sha256 of the uncompressed tar. The disk itself is not validated.
func (l *LayerReader) CopyDisk(ctx context.Context, w io.Writer) (diffID string, err error) {
	if err := copyDisk(ctx, w, l.tr, l.src); err != nil {
		return "", err
	}
	next, err := l.tr.Next()
	if err == nil {
		return "", reject.New(reject.TarEntry, "the layer holds %q after %s; a containerDisk holds nothing else", next.Name, api.DiskPath)
	}
	if !errors.Is(err, io.EOF) {
		return "", layerError(err, l.src)
	}
	if err := l.finish(); err != nil {
		return "", err
	}
	l.ended = true
	return fmt.Sprintf("sha256:%x", l.diff.Sum()), nil
}

// MaxTarTrailer bounds the bytes a layer's tar may hold after its end
// marker: Go's tar writer pads to 1 KiB, others to 10 KiB records.
const MaxTarTrailer = 1 << 20

// finish reads what follows the tar's last entry and refuses a layer with
// more in it than padding: uncompressed bytes after the tar that are not
// zeros or past MaxTarTrailer, or any byte after the compressed stream. Readers differ in what they make of
// such bytes. The blob is read to its end either way, so that its digest
// is verified.
func (l *LayerReader) finish() error {
	trailer, err := io.Copy(zeroChecker{}, io.LimitReader(l.tarIn, MaxTarTrailer+1))
	if err != nil {
		if errors.Is(err, errNonZero) {
			return reject.New(reject.InvalidLayer, "the layer holds data after the tar's end marker")
		}
		return layerError(err, l.src)
	}
	if trailer > MaxTarTrailer {
		return reject.New(reject.InvalidLayer, "the layer holds more than %d bytes after the tar's end marker", MaxTarTrailer)
	}
	after, err := io.Copy(io.Discard, l.buf)
	if err != nil {
		return fmt.Errorf("reading the layer: %w", err)
	}
	if after > 0 {
		return reject.New(reject.InvalidLayer, "%d bytes follow the layer's compressed stream; a second reader could take them for more of the layer", after)
	}
	return nil
}

// errNonZero is zeroChecker's answer to a non-zero byte.
var errNonZero = errors.New("non-zero byte")

// zeroChecker accepts only zero bytes.
type zeroChecker struct{}

func (zeroChecker) Write(p []byte) (int, error) {
	for i, b := range p {
		if b != 0 {
			return i, errNonZero
		}
	}
	return len(p), nil
}

// copyDisk copies the current tar entry to w, stopping when ctx is done.
func copyDisk(ctx context.Context, w io.Writer, tr *tar.Reader, src *trackedReader) error {
	buf := make([]byte, 1<<20)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		n, rerr := tr.Read(buf)
		if n > 0 {
			if _, err := w.Write(buf[:n]); err != nil {
				return fmt.Errorf("writing the disk: %w", err)
			}
		}
		if errors.Is(rerr, io.EOF) {
			return nil
		}
		if rerr != nil {
			return layerError(rerr, src)
		}
	}
}

// readDiskHead reads the first 64 KiB of the disk (size bytes), or its
// whole first cluster when it is a qcow2 image with larger clusters: the
// header and its extensions fill at most that cluster, 2 MiB.
func readDiskHead(r io.Reader, size int64) ([]byte, error) {
	head := make([]byte, min(size, convert.ProbeSize))
	if _, err := io.ReadFull(r, head); err != nil {
		return nil, err
	}
	if len(head) >= 24 && string(head[:4]) == "QFI\xfb" {
		if bits := binary.BigEndian.Uint32(head[20:]); bits > 16 && bits <= 21 {
			more := make([]byte, min(size, 1<<bits)-int64(len(head)))
			if _, err := io.ReadFull(r, more); err != nil {
				return nil, err
			}
			head = append(head, more...)
		}
	}
	return head, nil
}

// AddRejection records err in report as a rejection when err is one (of
// the containerDisk's shape or of the disk in it) and reports whether it
// was.
func AddRejection(report *api.ContainerDiskReport, err error) bool {
	if re := reject.As(err); re != nil {
		report.Verdict = api.VerdictRejected
		report.Reasons = append(report.Reasons, api.Rejection{Code: string(re.Reason), Message: re.Detail})
		return true
	}
	return false
}
