package main

import (
	"context"
	"io"

	"github.com/imagepipe/imagepipe/internal/convert"
	"github.com/imagepipe/imagepipe/internal/source"
)

// imageFlags are the validation flags shared by inspect, convert and import.
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

// openedSource is an opened source (local file, URL, s3://, stdin) ready for
// random access, unwrapped when it was compressed.
type openedSource struct {
	file    io.ReaderAt
	size    int64
	wrapper convert.Wrapper
	src     *source.Image
}

// openSource opens a source spec with the source flags. Nothing here needs
// the source's digest, so a local file is used in place without reading it
// (unless --checksum asks for a check). The caller calls close.
func openSource(ctx context.Context, g *globalOptions, f *sourceFlags, spec string, maxVirtual int64) (*openedSource, error) {
	opts := f.options(g, maxVirtual, nil)
	opts.SkipDigest = true
	src, err := source.Open(ctx, spec, opts)
	if err != nil {
		return nil, err
	}
	return &openedSource{file: src.ReaderAt, size: src.Size, wrapper: src.Wrapper, src: src}, nil
}

func (l *openedSource) close() { l.src.Close() }
