// Command zstdref decodes zstd layers the way CDI's released importer
// does, with the klauspost/compress version that importer links (go.mod
// requires exactly it), so that internal/containerdisk's differential
// fuzz can compare the gate's decoder with CDI's. It lives in a module of
// its own because one Go binary cannot link two versions of one module.
//
// Each layer is read as CDI's processLayer reads it through
// NewFormatReaders (pkg/importer in CDI v1.64): the first 512 bytes into a
// buffer, a zstd decoder with default options on
// io.MultiReader(buffer, rest), then the first 512 decompressed bytes into
// that same buffer, over compressed bytes the decoder may not have read
// yet, then the rest. CDI then looks for a nested format in those 512
// bytes; a containerDisk's tar starts with the entry disk/, which no
// format's magic matches, so that step is left out.
//
// Protocol, on standard input and output: zstdref first writes one line,
// "zstdref klauspost/compress VERSION". Then for each request, a 4-byte
// big-endian length and that many bytes of layer, it answers one record
// per reading: CDI's default decoder (concurrency min(GOMAXPROCS, 4),
// with GOMAXPROCS set to 4 as on a node of four or more cores), then a
// decoder of concurrency 1 (a one-core node). A record is a status byte
// (0 read to its end, 1 refused, 2 more than the output limit), the
// output's length (4 bytes, big-endian) and bytes (what was read before
// any error, at most the limit), and the error's length and text. The
// limit is the first argument, in bytes (default 4 MiB).
package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"

	"github.com/klauspost/compress/zstd"
)

const (
	statusRead    = 0
	statusRefused = 1
	statusOver    = 2
	// maxLayer bounds a request: fuzz inputs are small.
	maxLayer = 64 << 20
)

func main() {
	limit := 4 << 20
	if len(os.Args) > 1 {
		n, err := strconv.Atoi(os.Args[1])
		if err != nil || n <= 0 {
			fmt.Fprintln(os.Stderr, "zstdref: the output limit must be a positive number of bytes")
			os.Exit(2)
		}
		limit = n
	}
	runtime.GOMAXPROCS(4)
	if err := serve(os.Stdin, os.Stdout, limit); err != nil {
		fmt.Fprintln(os.Stderr, "zstdref:", err)
		os.Exit(1)
	}
}

func serve(in io.Reader, stdout io.Writer, limit int) error {
	out := bufio.NewWriter(stdout)
	fmt.Fprintf(out, "zstdref klauspost/compress %s\n", compressVersion())
	if err := out.Flush(); err != nil {
		return err
	}
	for {
		var n uint32
		if err := binary.Read(in, binary.BigEndian, &n); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("reading a request: %w", err)
		}
		if n > maxLayer {
			return fmt.Errorf("a request of %d bytes, over %d", n, maxLayer)
		}
		layer := make([]byte, n)
		if _, err := io.ReadFull(in, layer); err != nil {
			return fmt.Errorf("reading a request: %w", err)
		}
		for _, opts := range [][]zstd.DOption{nil, {zstd.WithDecoderConcurrency(1)}} {
			got, err := readAsCDI(layer, limit, opts)
			status := statusRead
			switch {
			case errors.Is(err, errOver):
				status = statusOver
			case err != nil:
				status = statusRefused
			}
			msg := ""
			if err != nil {
				msg = err.Error()
			}
			out.WriteByte(byte(status))
			binary.Write(out, binary.BigEndian, uint32(len(got)))
			out.Write(got)
			binary.Write(out, binary.BigEndian, uint32(len(msg)))
			out.WriteString(msg)
		}
		if err := out.Flush(); err != nil {
			return err
		}
	}
}

var errOver = errors.New("more output than the limit")

// readAsCDI reads layer as CDI's importer does, with the decoder options
// opts, returning at most limit bytes.
func readAsCDI(layer []byte, limit int, opts []zstd.DOption) ([]byte, error) {
	src := bytes.NewReader(layer)
	buf := make([]byte, 512)
	if _, err := io.ReadFull(src, buf); err != nil {
		return nil, fmt.Errorf("reading the layer's header: %w", err)
	}
	zr, err := zstd.NewReader(io.MultiReader(bytes.NewReader(buf), src), opts...)
	if err != nil {
		return nil, fmt.Errorf("opening the decoder: %w", err)
	}
	defer zr.Close()
	dec := zr.IOReadCloser()
	if _, err := io.ReadFull(dec, buf); err != nil {
		return nil, fmt.Errorf("reading the decompressed header: %w", err)
	}
	got := append(make([]byte, 0, 1<<16), buf...)
	rest, err := io.ReadAll(io.LimitReader(dec, int64(limit-len(got)+1)))
	got = append(got, rest...)
	if err == nil && len(got) > limit {
		return got[:limit], errOver
	}
	return got, err
}

// compressVersion is the version of klauspost/compress linked in.
func compressVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/klauspost/compress" {
				if d.Replace != nil {
					return d.Replace.Version
				}
				return d.Version
			}
		}
	}
	return "unknown"
}
