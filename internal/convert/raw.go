package convert

import (
	"context"
	"errors"
	"fmt"
	"io"

	"golang.org/x/sys/unix"
)

// rawSource reads a raw image. When the reader is a file it asks the
// filesystem for holes (SEEK_DATA/SEEK_HOLE) so a sparse image's holes are
// never read.
type rawSource struct {
	r    io.ReaderAt
	size int64
	fd   int // -1 when holes cannot be queried
}

// fder is implemented by *os.File.
type fder interface{ Fd() uintptr }

func newRawSource(r io.ReaderAt, size int64) *rawSource {
	s := &rawSource{r: r, size: size, fd: -1}
	if f, ok := r.(fder); ok {
		fd := int(f.Fd())
		// Probe once: filesystems without SEEK_DATA support return EINVAL.
		if _, err := unix.Seek(fd, 0, unix.SEEK_DATA); err == nil || errors.Is(err, unix.ENXIO) {
			s.fd = fd
		}
	}
	return s
}

func (s *rawSource) alignment() int64 { return 1 }

func (s *rawSource) extents(ctx context.Context, off, n int64, fn func(extent) error) error {
	end := off + n
	if s.fd < 0 {
		return fn(extent{kind: extentData, guest: off, length: n, host: off})
	}
	for pos := off; pos < end; {
		if err := ctx.Err(); err != nil {
			return err
		}
		data, err := unix.Seek(s.fd, pos, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) { // only a hole remains
			data = end
		} else if err != nil {
			return fmt.Errorf("querying holes of the raw image: %w", err)
		}
		data = min(data, end)
		if data > pos {
			if err := fn(extent{kind: extentZero, guest: pos, length: data - pos}); err != nil {
				return err
			}
			pos = data
			continue
		}
		hole, err := unix.Seek(s.fd, pos, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("querying holes of the raw image: %w", err)
		}
		hole = min(hole, end)
		if hole <= pos { // the file changed under us; read the rest
			hole = end
		}
		if err := fn(extent{kind: extentData, guest: pos, length: hole - pos, host: pos}); err != nil {
			return err
		}
		pos = hole
	}
	return nil
}

func (s *rawSource) readExtent(e extent, dst []byte, _ *scratch) error {
	if e.kind == extentZero {
		clear(dst)
		return nil
	}
	return readFull(s.r, dst, e.host)
}
