package main

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/imagepipe/imagepipe/internal/convert"
	"github.com/imagepipe/imagepipe/internal/reject"
	"github.com/imagepipe/imagepipe/internal/source"
	"github.com/imagepipe/imagepipe/pkg/api"
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
// random access, unwrapped when it was compressed; or, when streamed, only
// its head and tail can be read again.
type openedSource struct {
	file    io.ReaderAt
	size    int64
	wrapper convert.Wrapper
	src     *source.Image
}

// openSource opens a source spec with the source flags. Nothing here needs
// the source's digest, so a local file is used in place without reading it
// (unless --checksum asks for a check). stream lets a raw stream or
// compressed file be read through without spooling it (inspect). progress,
// when not nil, is told of the source bytes read. The caller calls close.
func openSource(ctx context.Context, g *globalOptions, f *sourceFlags, spec string, maxVirtual int64, stream bool, progress func(done, total int64)) (*openedSource, error) {
	opts := f.options(g, maxVirtual, progress)
	opts.SkipDigest = true
	opts.StreamRaw = stream
	src, err := source.Open(ctx, spec, opts)
	if err != nil {
		return nil, explainSource(err)
	}
	return &openedSource{file: src.ReaderAt, size: src.Size, wrapper: src.Wrapper, src: src}, nil
}

func (l *openedSource) close() { l.src.Close() }

// explainSource adds to a failure to open a source the flag that changes
// it. A spool cap rejection keeps its *reject.Error, with the flag named in
// its detail so that JSON reports carry it too.
func explainSource(err error) error {
	if re := reject.As(err); re != nil && re.Reason == reject.SpoolLimit {
		// The message of err was fixed when it was wrapped; extend both.
		const hint = "; raise the limit with --max-spool SIZE, or import from a local uncompressed file, which is never copied"
		re.Detail += hint
		return fmt.Errorf("%w%s", err, hint)
	}
	var se *source.SpaceError
	if errors.As(err, &se) {
		return fmt.Errorf("%w; point --temp-dir at a file system with more free space", err)
	}
	var unknown x509.UnknownAuthorityError
	var hostname x509.HostnameError
	var invalid x509.CertificateInvalidError
	if errors.As(err, &unknown) || errors.As(err, &hostname) || errors.As(err, &invalid) {
		return &hintedError{err: err, hint: "trust the server's CA with --ca-file FILE.pem, or skip the check with --insecure"}
	}
	return err
}

// refuseTerminalStdin refuses the source "-" when standard input is a
// terminal: cmd would wait for an image nobody is going to type.
func refuseTerminalStdin(cmd *cobra.Command, spec string) error {
	if spec != "-" || !term.IsTerminal(int(os.Stdin.Fd())) {
		return nil
	}
	path := cmd.CommandPath()
	return &hintedError{
		err:  &usageError{errors.New(`SOURCE "-" reads the image from standard input, which is a terminal`)},
		hint: fmt.Sprintf("pipe the image in (%s - ... < disk.qcow2, or curl -sL URL | %s - ...), or give its path or URL instead of -", path, path),
	}
}

// reportRejection prints a rejection of the source as an inspect-style
// report on standard output under -o json or yaml, so scripts read the
// reason the same way as from inspect, in place of the error object; the
// error is returned either way (exit 3, the sentence on standard error).
func reportRejection(cmd *cobra.Command, out *outputFlags, spec string, err error) error {
	re := reject.As(err)
	if re == nil || !out.machine() {
		return err
	}
	report := api.ImageReport{
		Source:  source.DisplayName(spec),
		Format:  "unknown",
		Verdict: api.VerdictRejected,
		Reasons: []api.Rejection{rejection(re)},
	}
	if perr := printReport(cmd.OutOrStdout(), out, &report); perr != nil {
		return perr
	}
	return &shownError{err}
}

// rejection is the JSON model of a rejection.
func rejection(re *reject.Error) api.Rejection {
	return api.Rejection{Code: string(re.Reason), Message: re.Detail}
}
