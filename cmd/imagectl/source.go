package main

import (
	"context"
	"fmt"
	"os"

	"github.com/imagepipe/imagepipe/internal/convert"
)

// imageFlags are the validation flags shared by inspect and convert.
type imageFlags struct {
	format         string
	allowISO       bool
	maxVirtualSize int64
}

func (f *imageFlags) openOptions() convert.OpenOptions {
	return convert.OpenOptions{
		Format:         convert.Format(f.format),
		AllowISO:       f.allowISO,
		MaxVirtualSize: f.maxVirtualSize,
	}
}

// localImage is a local image file ready for random access: the file itself,
// or a sparse temporary copy of its decompressed contents when it is
// wrapped in gzip, zstd or xz.
type localImage struct {
	file    *os.File
	size    int64
	wrapper convert.Wrapper
	temp    string // path of the spooled copy, removed by close
}

// openLocal opens path and unwraps it if needed. The caller calls close.
func openLocal(ctx context.Context, path string, maxVirtual int64) (*localImage, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	head := make([]byte, 8)
	n, _ := f.ReadAt(head, 0)
	if convert.DetectWrapper(head[:n]) == convert.WrapperNone {
		return &localImage{file: f, size: st.Size()}, nil
	}
	defer f.Close()
	inner, wrapper, err := convert.Unwrap(f)
	if err != nil {
		return nil, err
	}
	defer inner.Close()
	tmp, err := os.CreateTemp("", "imagectl-unwrapped-*")
	if err != nil {
		return nil, err
	}
	img := &localImage{file: tmp, wrapper: wrapper, temp: tmp.Name()}
	img.size, err = convert.Spool(ctx, inner, tmp, convert.SpoolLimit(maxVirtual))
	if err != nil {
		img.close()
		return nil, fmt.Errorf("decompressing %s (%s): %w", path, wrapper, err)
	}
	return img, nil
}

func (l *localImage) close() {
	l.file.Close()
	if l.temp != "" {
		os.Remove(l.temp)
	}
}
