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
	img, err := openLocal(ctx, f, path, o)
	if err != nil {
		f.Close()
		return nil, err
	}
	if img.file != f {
		f.Close() // spooled: the image reads its copy
	}
	return img, nil
}

// localFile is an open local file and its entry in the digest cache.
type localFile struct {
	f      *os.File
	path   string
	st     os.FileInfo
	cache  digestCache
	key    fileKey
	keyOK  bool
	cached *string // the digest the cache knows, or nil
	// wrapper is the compression the file starts with.
	wrapper convert.Wrapper
}

// remember stores a computed digest, only if the file did not change
// while it was being read.
func (l *localFile) remember(digest string) {
	if !l.keyOK {
		return
	}
	if st2, err := l.f.Stat(); err == nil {
		if key2, ok := keyOf(l.path, st2); ok && key2 == l.key {
			l.cache.store(l.key, digest)
		}
	}
}

// openLocal opens the open file f as an image; the image keeps f open
// only when it reads f itself.
func openLocal(ctx context.Context, f *os.File, path string, o *config) (*Image, error) {
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
	l := &localFile{f: f, path: path, st: st, cache: newDigestCache(o.log)}
	l.key, l.keyOK = keyOf(path, st)
	if l.keyOK {
		if d, ok := l.cache.lookup(l.key); ok {
			l.cached = &d
		}
	}
	var img *Image
	l.wrapper = convert.DetectWrapper(head[:n])
	if l.wrapper != convert.WrapperNone {
		img, err = l.spool(ctx, o)
	} else {
		img, err = l.inPlace(ctx, o)
	}
	if err != nil {
		return nil, err
	}
	img.uploadName = l.key.uploadName(l.keyOK)
	return img, nil
}

// spool decompresses a wrapped file into a spooled copy, or reads it
// through (Options.StreamRaw): an xz file with the xz program (openXZ)
// when it takes it, anything else as a stream.
func (l *localFile) spool(ctx context.Context, o *config) (*Image, error) {
	if img, ok, err := l.openXZ(ctx, o); ok {
		return img, err
	}
	_ = unix.Fadvise(int(l.f.Fd()), 0, 0, unix.FADV_SEQUENTIAL)
	img, err := o.spool(ctx, io.NewSectionReader(l.f, 0, l.st.Size()), l.st.Size(), l.cached)
	if err != nil {
		return nil, err
	}
	if l.cached == nil {
		l.remember(img.Digest)
	}
	return img, nil
}

// inPlace uses an unwrapped file as it is, with its digest from the cache,
// hashed now, hashed in the background (DeferDigest) or not at all
// (SkipDigest).
func (l *localFile) inPlace(ctx context.Context, o *config) (*Image, error) {
	f, size := l.f, l.st.Size()
	var digest string
	switch {
	case l.cached != nil:
		digest = *l.cached
	case o.SkipDigest && o.checksum == "":
		// Nothing needs the digest: a local file is used in place, unread.
	case o.DeferDigest && o.checksum == "":
		img := &Image{ReaderAt: f, Size: size, OriginalSize: size, file: f, hashed: make(chan struct{})}
		hctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		img.cancelHash = cancel
		go func() {
			defer close(img.hashed)
			img.Digest, img.hashErr = hashFile(hctx, f, size, nil)
			if img.hashErr == nil {
				l.remember(img.Digest)
			}
		}()
		return img, nil
	default:
		var err error
		if digest, err = hashFile(ctx, f, size, o.Progress); err != nil {
			return nil, err
		}
		l.remember(digest)
	}
	if err := o.verify(digest); err != nil {
		return nil, err
	}
	return &Image{ReaderAt: f, Size: size, Digest: digest, OriginalSize: size, file: f}, nil
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
