package source

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/imagepipe/imagepipe/internal/convert"
	"github.com/imagepipe/imagepipe/internal/reject"
)

// This file is the rest of the package's one way into xz decoding: spool
// and localFile.spool offer their source to openXZ first, and unwrap gives
// convert.UnwrapWith an xzDecoder. Behind them, xzspool.go runs the xz
// program writing a spool, xzread.go runs it for a reader, and xzring.go
// holds the memory file that reader reads. docs/import.md says why.

// openXZ lets the xz program, when there is one, decode the xz stream br
// straight into the spool (spoolXZ). ok is false when it does not take the
// stream (no program, not xz, Options.StreamRaw, or a program that did not
// start, having read nothing): the caller then decodes br with unwrap.
func (o *config) openXZ(ctx context.Context, br *bufio.Reader) (img *Image, ok bool, err error) {
	path := xzProgram()
	if path == "" || !startsXZ(br) || o.StreamRaw {
		return nil, false, nil
	}
	img, err = o.spoolXZ(ctx, path, br)
	if errors.Is(err, errXZNotStarted) {
		o.log.Debug("xz could not write the spool; decoding for a reader or in Go", "program", path, "error", err)
		return nil, false, nil
	}
	return img, true, err
}

// openXZ lets the xz program, when there is one, decode the xz file l
// itself, as `xz -dc FILE` does: into the spool (spoolXZ) or, with
// Options.StreamRaw, for a reader (unwrap), while the file is hashed
// alongside (decodeXZ). ok is false when it does not take the file (no
// program, not xz, or a program that could not read the file itself): the
// caller then reads the file as a stream.
func (l *localFile) openXZ(ctx context.Context, o *config) (img *Image, ok bool, err error) {
	path := xzProgram()
	if path == "" || l.wrapper != convert.WrapperXZ {
		return nil, false, nil
	}
	img, err = l.decodeXZ(ctx, o, func(in *os.File) (*Image, error) {
		if o.StreamRaw {
			return o.unwrap(ctx, io.NewSectionReader(in, 0, l.st.Size()), l.st.Size(), in)
		}
		return o.spoolXZ(ctx, path, in)
	})
	if errors.Is(err, errXZNotStarted) {
		o.log.Debug("xz could not read the file itself; decoding the stream", "program", path, "error", err)
		return nil, false, nil
	}
	return img, true, err
}

// decodeXZ decodes an xz file with the xz program, which reads the file
// itself, as `xz -dc FILE` does (decode spools or streams it), while the
// file is hashed alongside unless the digest cache knows it or nothing
// needs it (Options.SkipDigest). The program gets a file description of its
// own, in: opened through /proc/self/fd, so it is the very file opened,
// whatever its path names now; hashing moves l.f's offset.
func (l *localFile) decodeXZ(ctx context.Context, o *config, decode func(in *os.File) (*Image, error)) (*Image, error) {
	size := l.st.Size()
	if size > o.maxSize {
		return nil, &reject.Error{
			Reason: reject.Wrapper,
			Detail: fmt.Sprintf("the compressed image exceeds %d bytes", o.maxSize),
		}
	}
	in, err := os.Open(fmt.Sprintf("/proc/self/fd/%d", l.f.Fd()))
	if err != nil {
		return nil, fmt.Errorf("reopening: %w", err)
	}
	defer in.Close()
	hctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type hashed struct {
		digest string
		err    error
	}
	digest := make(chan hashed, 1)
	switch {
	case l.cached != nil:
		digest <- hashed{digest: *l.cached}
	case o.SkipDigest && o.checksum == "":
		digest <- hashed{} // nothing needs it
	default:
		go func() {
			d, err := hashFile(hctx, l.f, size, nil)
			digest <- hashed{d, err}
		}()
	}
	img, err := decode(in)
	if err != nil {
		cancel()
		<-digest
		return nil, err
	}
	h := <-digest
	if h.err != nil {
		img.Close()
		return nil, h.err
	}
	img.Digest, img.OriginalSize = h.digest, size
	if err := o.verify(img.Digest); err != nil {
		img.Close()
		return nil, err
	}
	if l.cached == nil && img.Digest != "" {
		l.remember(img.Digest)
	}
	o.log.Debug("opened xz file", "bytes", img.Size, "original_bytes", size, "digest", img.Digest)
	return img, nil
}

// xzDecoder is the xz decoder unwrap gives convert.UnwrapWith: the xz
// program when there is one (startXZ), else the pure-Go decoder. The
// program reads file when it is not nil, and the stream given otherwise.
type xzDecoder struct {
	o       *config
	path    string    // the program, or "" for the pure-Go decoder
	file    *os.File  // what the program reads, or nil for the stream
	started *xzReader // the program's output, once it has started
}

// newXZDecoder returns the xz decoder for one call of unwrap.
func (o *config) newXZDecoder(file *os.File) *xzDecoder {
	return &xzDecoder{o: o, path: xzProgram(), file: file}
}

// unwrapOptions are the options of convert.UnwrapWith that decode xz with d.
func (d *xzDecoder) unwrapOptions() convert.UnwrapOptions {
	if d.path == "" {
		return convert.UnwrapOptions{}
	}
	return convert.UnwrapOptions{XZ: d.start}
}

// start starts the program on r, or on d.file, and returns its output; nil,
// having read nothing, when it does not start, and convert decodes r itself.
func (d *xzDecoder) start(r io.Reader) io.ReadCloser {
	var progress func(done, total int64) // a stream's reader reports it
	if d.file != nil {
		r, progress = d.file, d.o.Progress
	}
	x := startXZ(d.path, r, progress)
	if x == nil {
		d.o.log.Debug("xz did not start; decoding in Go", "program", d.path)
		return nil
	}
	d.started = x
	return x
}

// toolErr is the program's failure for a reason of its own (it was killed,
// e.g. by the OOM killer), which convert reports as a corrupt stream; nil
// when the program did not fail so, or did not run.
func (d *xzDecoder) toolErr() error {
	if d.started == nil {
		return nil
	}
	return d.started.toolErr
}

// xzProgram finds the xz program that decodes xz sources: "xz" in PATH
// when it is XZ Utils 5.2 or later, or "" when there is none and the
// pure-Go decoder serves. (Another xz, e.g. busybox's, may not take the
// options startXZ gives, and its failures would read as broken images.)
// Tests replace it.
var xzProgram = sync.OnceValue(func() string {
	path, err := exec.LookPath("xz")
	if err != nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, "--version")
	cmd.Env = xzEnv(os.Environ())
	out, err := cmd.Output()
	if err != nil || !xzUtilsVersionOK(string(out)) {
		return ""
	}
	return path
})

// xzVersionRE matches the first line of `xz --version` of XZ Utils.
var xzVersionRE = regexp.MustCompile(`^xz \(XZ Utils\) (\d+)\.(\d+)`)

// xzUtilsVersionOK says whether `xz --version` printed out, naming XZ Utils
// 5.2 or later.
func xzUtilsVersionOK(out string) bool {
	m := xzVersionRE.FindStringSubmatch(out)
	if m == nil {
		return false
	}
	major, _ := strconv.Atoi(m[1])
	minor, _ := strconv.Atoi(m[2])
	return major > 5 || major == 5 && minor >= 2
}

// xzEnv is env without the variables through which xz takes options.
func xzEnv(env []string) []string {
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		if strings.HasPrefix(kv, "XZ_DEFAULTS=") || strings.HasPrefix(kv, "XZ_OPT=") || strings.HasPrefix(kv, "LC_ALL=") {
			continue
		}
		out = append(out, kv)
	}
	return append(out, "LC_ALL=C") // messages in English, as the rest
}

// startsXZ reports whether the stream r starts with the xz magic.
func startsXZ(r *bufio.Reader) bool {
	head, _ := r.Peek(8)
	return convert.DetectWrapper(head) == convert.WrapperXZ
}
