package source

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/imagepipe/imagepipe/internal/convert"
)

// hashBufferSize is the read size of the digest pass over a local file.
const hashBufferSize = 1 << 20

// openFile opens a local file: the file itself when it is not wrapped, a
// spooled decompressed copy when it is.
func openFile(ctx context.Context, path string, o *config) (*Image, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	keep := false
	defer func() {
		if !keep {
			f.Close()
		}
	}()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, errors.New("not a regular file")
	}
	head := make([]byte, 8)
	n, err := f.ReadAt(head, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("reading: %w", err)
	}
	wrapper := convert.DetectWrapper(head[:n])

	cache := newDigestCache(o.log)
	key, keyOK := keyOf(path, st)
	var cached *string
	if keyOK {
		if d, ok := cache.lookup(key); ok {
			cached = &d
		}
	}
	// Remember a computed digest only if the file did not change while it
	// was being read.
	remember := func(digest string) {
		if !keyOK {
			return
		}
		if st2, err := f.Stat(); err == nil {
			if key2, ok := keyOf(path, st2); ok && key2 == key {
				cache.store(key, digest)
			}
		}
	}

	if wrapper != convert.WrapperNone {
		_ = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_SEQUENTIAL)
		img, err := o.spool(ctx, io.NewSectionReader(f, 0, st.Size()), st.Size(), cached)
		if err != nil {
			return nil, err
		}
		if cached == nil {
			remember(img.Digest)
		}
		img.uploadName = key.uploadName(keyOK)
		return img, nil
	}

	var digest string
	switch {
	case cached != nil:
		digest = *cached
	case o.SkipDigest && o.checksum == "":
		// Nothing needs the digest: a local file is used in place, unread.
	case o.DeferDigest && o.checksum == "":
		keep = true
		img := &Image{ReaderAt: f, Size: st.Size(), OriginalSize: st.Size(), file: f, hashed: make(chan struct{}), uploadName: key.uploadName(keyOK)}
		hctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		img.cancelHash = cancel
		go func() {
			defer close(img.hashed)
			img.Digest, img.hashErr = hashFile(hctx, f, st.Size(), nil)
			if img.hashErr == nil {
				remember(img.Digest)
			}
		}()
		return img, nil
	default:
		digest, err = hashFile(ctx, f, st.Size(), o.Progress)
		if err != nil {
			return nil, err
		}
		remember(digest)
	}
	if err := o.verify(digest); err != nil {
		return nil, err
	}
	keep = true
	return &Image{ReaderAt: f, Size: st.Size(), Digest: digest, OriginalSize: st.Size(), file: f, uploadName: key.uploadName(keyOK)}, nil
}

// uploadName names the upload of a local file by its path, device, inode,
// size and modification and change times, so that an import interrupted
// before the file's digest was known still resumes in a later run. Any
// write to the file changes its change time, and so the name; a name that
// still matched other content would only cost a fresh upload, since the
// registry checks the layer's digest. ok false (no key) gives "".
func (k fileKey) uploadName(ok bool) string {
	if !ok {
		return ""
	}
	return fmt.Sprintf("file:%s:%d:%d:%d:%d:%d", k.Path, k.Dev, k.Ino, k.Size, k.MtimeNs, k.CtimeNs)
}

// hashFile returns the digest of the first size bytes of f in one
// sequential pass.
func hashFile(ctx context.Context, f *os.File, size int64, progress func(done, total int64)) (string, error) {
	_ = unix.Fadvise(int(f.Fd()), 0, size, unix.FADV_SEQUENTIAL)
	h := sha256.New()
	buf := make([]byte, hashBufferSize)
	zeros := make([]byte, hashBufferSize)
	dataEnd := int64(-1) // end of the data extent at off; holes read as zeros
	var off int64
	for off < size {
		if err := ctx.Err(); err != nil {
			return "", err
		}
		// Holes of a sparse file are hashed as zeros without reading them.
		if off >= dataEnd {
			var data int64
			data, dataEnd = nextData(f, off, size)
			off = hashZeros(h, zeros, off, data, size, progress)
			continue
		}
		n, err := f.ReadAt(buf[:min(int64(len(buf)), size-off, dataEnd-off)], off)
		h.Write(buf[:n])
		off += int64(n)
		if progress != nil && n > 0 {
			progress(off, size)
		}
		if err != nil {
			if errors.Is(err, io.EOF) && off < size {
				return "", fmt.Errorf("the file shrank to %d bytes while it was read", off)
			}
			if !errors.Is(err, io.EOF) {
				return "", fmt.Errorf("reading: %w", err)
			}
		}
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// nextData returns the next data extent [data, end) at or after off; a file
// system that cannot tell holes says everything is data.
func nextData(f *os.File, off, size int64) (data, end int64) {
	fd := int(f.Fd())
	data, err := unix.Seek(fd, off, unix.SEEK_DATA)
	if errors.Is(err, unix.ENXIO) {
		return size, size
	}
	if err != nil || data < off {
		return off, size
	}
	data = min(data, size)
	end, err = unix.Seek(fd, data, unix.SEEK_HOLE)
	if err != nil || end <= data {
		return data, size
	}
	return data, min(end, size)
}

// hashZeros feeds the zeros of the hole [off, end) to h and returns end.
func hashZeros(h hash.Hash, zeros []byte, off, end, size int64, progress func(done, total int64)) int64 {
	for off < end {
		n := min(int64(len(zeros)), end-off)
		h.Write(zeros[:n])
		off += n
		if progress != nil {
			progress(off, size)
		}
	}
	return off
}
