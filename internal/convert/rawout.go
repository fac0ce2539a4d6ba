package convert

import (
	"context"
	"io"
	"strings"
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
// another format. It reads only what Detect reads: the first 64 KiB, the
// ISO volume descriptors and the last sector of the guest disk.
func (img *Image) checkRawOutput(ctx context.Context) error {
	g := &guestReader{ctx: ctx, img: img}
	defer g.sc.close()
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
	return reject(ReasonAmbiguousRaw, "the guest disk's own content looks like a %s image, so a raw copy of it would be read as that format by whoever probes it next; convert to qcow2 output instead (--disk-format qcow2 or -O qcow2)", strings.Join(other, " and "))
}

// guestReader reads the guest disk of an image, as an io.ReaderAt, for the
// few small reads format detection makes.
type guestReader struct {
	ctx context.Context
	img *Image
	sc  scratch
}

func (g *guestReader) ReadAt(p []byte, off int64) (int, error) {
	vsize := g.img.info.VirtualSize
	if off >= vsize {
		return 0, io.EOF
	}
	n := min(int64(len(p)), vsize-off)
	err := g.img.src.extents(g.ctx, off, n, func(e extent) error {
		return g.img.src.readExtent(e, p[e.guest-off:e.guest-off+e.length], &g.sc)
	})
	if err != nil {
		return 0, err
	}
	if n < int64(len(p)) {
		return int(n), io.EOF
	}
	return int(n), nil
}
