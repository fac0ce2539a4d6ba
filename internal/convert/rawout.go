package convert

import (
	"context"
	"io"
	"strings"

	"github.com/imagepipe/imagepipe/internal/reject"
)

// A raw disk carries no format of its own: whoever reads it next (CDI's
// importer, qemu-img, a hypervisor) may probe its first and last bytes and
// take it for whatever format they spell. Converting a qcow2 image whose
// guest disk begins with a qcow2 header into raw output would hand that
// reader an image with a backing file or an encryption header of the
// tenant's choosing: the CVE-2008-2004 class, one step later. So raw output
// is refused when the guest content it would write matches any signature
// Detect knows, except an ISO 9660 filesystem, which every reader treats as
// raw. qcow2 output names its format in its header and has no such risk.

// checkRawOutput refuses raw output of img when its guest content probes as
// another format. It reads the guest disk once where Detect looks: the first
// ProbeSize bytes (which hold the ISO volume descriptors too) and the last
// sector; for a qcow2 image that is at most a few clusters of the file.
func (img *Image) checkRawOutput(ctx context.Context) error {
	g, err := readGuestEnds(ctx, img)
	if err != nil {
		return err
	}
	det, err := Detect(g, img.info.VirtualSize)
	if err != nil {
		return err
	}
	var other []string
	for _, f := range det.Matches {
		if f != FormatISO {
			other = append(other, string(f))
		}
	}
	if len(other) == 0 {
		return nil
	}
	return reject.New(reject.AmbiguousRaw, "the guest disk's own content looks like a %s image, so a raw copy of it would be read as that format by whoever probes it next; convert to qcow2 output instead (--disk-format qcow2 or -O qcow2)", strings.Join(other, " and "))
}

// guestEnds holds the first and last bytes of a guest disk and serves
// Detect's reads from them; bytes in between read as zeros, which no
// signature matches.
type guestEnds struct {
	size       int64
	head, tail []byte // tail starts at size-len(tail)
}

func readGuestEnds(ctx context.Context, img *Image) (*guestEnds, error) {
	vsize := img.info.VirtualSize
	g := &guestEnds{size: vsize, head: make([]byte, min(vsize, ProbeSize))}
	var sc scratch
	defer sc.close()
	read := func(dst []byte, off int64) error {
		return img.src.extents(ctx, off, int64(len(dst)), func(e extent) error {
			return img.src.readExtent(e, dst[e.guest-off:e.guest-off+e.length], &sc)
		})
	}
	if err := read(g.head, 0); err != nil {
		return nil, err
	}
	if vsize > int64(len(g.head)) {
		g.tail = make([]byte, min(512, vsize-int64(len(g.head))))
		if err := read(g.tail, vsize-int64(len(g.tail))); err != nil {
			return nil, err
		}
	}
	return g, nil
}

func (g *guestEnds) ReadAt(p []byte, off int64) (int, error) {
	if off >= g.size {
		return 0, io.EOF
	}
	n := min(int64(len(p)), g.size-off)
	clear(p[:n])
	if off < int64(len(g.head)) {
		copy(p[:n], g.head[off:])
	}
	if tailStart := g.size - int64(len(g.tail)); off+n > tailStart && len(g.tail) > 0 {
		from := max(off, tailStart)
		copy(p[from-off:n], g.tail[from-tailStart:])
	}
	if n < int64(len(p)) {
		return int(n), io.EOF
	}
	return int(n), nil
}
