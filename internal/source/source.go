package source

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"

	"github.com/imagepipe/imagepipe/internal/convert"
	"github.com/imagepipe/imagepipe/internal/reject"
)

// Options configures Open. The zero value opens any spec with the defaults
// documented on each field.
type Options struct {
	// Checksum, when set, is the expected digest of the original bytes,
	// "sha256:<hex>". Open fails with a *ChecksumError when it does not match.
	Checksum string
	// TempDir is where spooled copies go; "" means os.TempDir(). Its free
	// space is checked before and while spooling: a spool never leaves less
	// than SpoolMargin bytes free (a *SpaceError otherwise).
	TempDir string
	// MaxSize caps the bytes spooled or unwrapped, and the announced size of
	// a download; 0 means convert.SpoolLimit(convert.DefaultMaxVirtualSize).
	// An unwrapped local file is not copied and not capped here: the disk
	// engine checks its virtual size.
	MaxSize int64
	// MaxSpool caps the bytes written to TempDir for one image; 0 means
	// DefaultMaxSpool, a negative value that nothing may be spooled. An image whose spool would pass it is rejected with
	// reject.SpoolLimit: before any byte is spooled when its size is
	// known (an unwrapped download with a Content-Length or an S3 object
	// size), as soon as the cap is passed otherwise.
	MaxSpool int64
	// StreamRaw lets Open judge a stream or a wrapped file without spooling
	// it when the unwrapped bytes are not qcow2: the bytes are read once,
	// through the digest and the size count, and only the first 1 MiB and
	// the last 64 KiB are kept, which is all the disk engine's format
	// detection reads of a raw image. The Image then has Streamed set and
	// its ReaderAt returns ErrNotSpooled for the bytes in between. A qcow2
	// image is spooled as usual. MaxSpool still applies, so a streamed image
	// gets the verdict a spooled one would. inspect uses it; convert and
	// import, which read every byte of the image again, do not.
	StreamRaw bool
	// S3 configures s3:// sources; empty fields fall back to the AWS_*
	// environment variables.
	S3 S3Options
	// HTTPClient fetches http(s):// sources and, through its Transport,
	// s3:// sources. nil means a client with connect, TLS and response
	// header timeouts but no overall timeout, since images are large. At most
	// 5 redirects are followed unless the client sets its own CheckRedirect.
	HTTPClient *http.Client
	// CAFile names a PEM file of CA certificates to trust, besides the
	// system's, for https:// sources and S3 endpoints reached over HTTPS.
	// It configures the default client: setting it with HTTPClient is an
	// error, since that client's TLS settings are its own.
	CAFile string
	// InsecureSkipVerify accepts any certificate from an https:// source or
	// an S3 endpoint reached over HTTPS: the transfer is encrypted, but
	// not to a server known to be the right one. The digest and
	// Checksum still hold the bytes to what was expected. Like CAFile, it
	// configures the default client and is an error with HTTPClient.
	InsecureSkipVerify bool
	// Logger receives debug messages and one info message per resumed
	// download; nil discards them.
	Logger *slog.Logger
	// DeferDigest lets Open return at once for an unwrapped local file whose
	// digest is not cached, hashing it in the background while the caller
	// already reads the image; Image.WaitDigest then gives the digest.
	DeferDigest bool
	// SkipDigest lets Open leave Image.Digest empty for an unwrapped local
	// file, which is then not read at all, and for an xz file that the xz
	// program reads (inspect and convert do not need the digest). Other
	// sources are read once anyway and get a digest.
	SkipDigest bool
	// Progress, when set, is called as source bytes are read during Open's
	// sequential pass, with the bytes read so far and the total (-1 when
	// unknown), from one goroutine at a time (not always Open's: an xz
	// source is fed to the xz program from a goroutine of its own). It is
	// not called when the digest of an unwrapped local file comes from the
	// cache, since nothing is read.
	Progress func(done, total int64)
}

// S3Options locates and authenticates an S3-compatible object store. Each
// empty field falls back to the environment variable named on it.
type S3Options struct {
	// Endpoint is "host[:port]" or a URL; AWS_ENDPOINT_URL_S3, then
	// AWS_ENDPOINT_URL, then s3.amazonaws.com. A URL's scheme decides TLS.
	Endpoint string
	// Region is the bucket's region; AWS_REGION, then AWS_DEFAULT_REGION,
	// then discovered from the server.
	Region string
	// AccessKey is the access key ID; AWS_ACCESS_KEY_ID.
	AccessKey string
	// SecretKey is the secret access key; AWS_SECRET_ACCESS_KEY.
	SecretKey string
	// SessionToken is the temporary session token; AWS_SESSION_TOKEN.
	SessionToken string
	// Insecure selects plain HTTP for an endpoint given without a scheme.
	Insecure bool
}

// Image is an opened disk image: random access to its (unwrapped) bytes and
// what is known about the original. The caller must call Close.
type Image struct {
	// ReaderAt reads the image bytes after unwrapping. For an unwrapped
	// local file it is that *os.File; otherwise a sparse temporary *os.File.
	ReaderAt io.ReaderAt
	// Size is the number of bytes ReaderAt serves.
	Size int64
	// Wrapper is the compression that was removed, or convert.WrapperNone.
	Wrapper convert.Wrapper
	// Digest is "sha256:<hex>" of the original bytes as given (empty only
	// with Options.SkipDigest), before
	// unwrapping.
	Digest string
	// OriginalSize is the number of original bytes, before unwrapping.
	OriginalSize int64
	// Name is the spec given to Open, for messages.
	Name string
	// Streamed is set when Options.StreamRaw kept only the head and the
	// tail of the image; ReaderAt then fails on the bytes in between.
	Streamed bool
	// DataBytes is, for a streamed image, the bytes in 4 KiB blocks that are
	// not all zeros: what a spool would have allocated.
	DataBytes int64

	closeOnce sync.Once
	closeErr  error
	file      *os.File // the file behind ReaderAt

	// A digest being computed in the background (Options.DeferDigest).
	hashed     chan struct{} // closed when Digest or hashErr is set
	hashErr    error
	cancelHash context.CancelFunc
	temp       string // a temporary file still to remove, when unlinking it early failed

	uploadName string // see UploadName
}

// Close closes the image and removes its temporary file, if any. It is safe
// to call more than once.
func (i *Image) Close() error {
	i.closeOnce.Do(func() {
		if i.hashed != nil {
			i.cancelHash()
			<-i.hashed
		}
		if i.file != nil {
			i.closeErr = i.file.Close()
		}
		if i.temp != "" {
			if err := os.Remove(i.temp); err != nil && i.closeErr == nil && !errors.Is(err, os.ErrNotExist) {
				i.closeErr = err
			}
		}
	})
	return i.closeErr
}

// WaitDigest returns the digest of the original bytes, waiting for the
// background hash that Options.DeferDigest started, if any.
func (i *Image) WaitDigest(ctx context.Context) (string, error) {
	if i.hashed == nil {
		return i.Digest, nil
	}
	select {
	case <-ctx.Done():
		return "", ctx.Err()
	case <-i.hashed:
		return i.Digest, i.hashErr
	}
}

// DigestDeferred reports whether the digest is computed in the background
// (Options.DeferDigest), so that Digest may still be empty: WaitDigest
// gives it.
func (i *Image) DigestDeferred() bool { return i.hashed != nil }

// UploadName names an upload of the image's bytes before their digest is
// known, so that an interrupted import resumes in a later run: for a local
// file its absolute path, device, inode, size and modification and change
// times; "" for other sources, whose digest is known once Open returns.
func (i *Image) UploadName() string { return i.uploadName }

// stdin is what the spec "-" reads; tests replace it.
var stdin io.Reader = os.Stdin

// schemeRE matches a URL scheme, to tell URLs from local paths.
var schemeRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*://`)

// Open opens the image named by spec: a local path, "-" for standard input,
// an http:// or https:// URL, or s3://bucket/key. It reads the source once
// to compute its digest (unless the digest cache already knows a local file)
// and, unless it is an unwrapped local file, to spool it into a sparse
// temporary file. The caller must Close the returned Image.
func Open(ctx context.Context, spec string, opts Options) (*Image, error) {
	img, err := open(ctx, spec, opts)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", DisplayName(spec), err)
	}
	img.Name = spec
	return img, nil
}

func open(ctx context.Context, spec string, opts Options) (*Image, error) {
	o, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	lower := strings.ToLower(spec)
	switch {
	case spec == "":
		return nil, errors.New("no image given")
	case spec == "-":
		return o.spool(ctx, stdin, -1, nil)
	case strings.HasPrefix(lower, "http://"), strings.HasPrefix(lower, "https://"):
		return openHTTP(ctx, spec, o)
	case strings.HasPrefix(lower, "s3://"):
		return openS3(ctx, spec, o)
	case schemeRE.MatchString(spec):
		return nil, errors.New("unsupported URL scheme; give a local path, -, an http(s):// URL or s3://bucket/key")
	default:
		return openFile(ctx, spec, o)
	}
}

// DisplayName is how errors name a spec: stdin by that name, URLs without
// their password and query string, since presigned URLs carry credentials
// there.
func DisplayName(spec string) string {
	if spec == "-" {
		return "stdin"
	}
	if !schemeRE.MatchString(spec) {
		return spec
	}
	u, err := url.Parse(spec)
	if err != nil {
		return spec[:strings.Index(spec, "://")+3] + "…"
	}
	return redactURL(u)
}

// redactURL renders u without its password and query string.
func redactURL(u *url.URL) string {
	c := *u
	if c.User != nil {
		c.User = url.User(c.User.Username())
	}
	c.Fragment, c.RawFragment = "", ""
	if c.RawQuery != "" {
		c.RawQuery = ""
		return c.String() + "?…"
	}
	return c.String()
}

// config is Options with defaults applied.
type config struct {
	Options
	checksum string
	log      *slog.Logger
	maxSize  int64
	maxSpool int64
	// tls is the TLS configuration of the default HTTP and S3 clients; nil
	// keeps Go's defaults.
	tls *tls.Config
	// freeSpace returns the free bytes of a directory's file system; tests
	// replace it.
	freeSpace func(dir string) (int64, error)
}

func newConfig(opts Options) (*config, error) {
	sum, err := parseChecksum(opts.Checksum)
	if err != nil {
		return nil, err
	}
	o := &config{Options: opts, checksum: sum, log: opts.Logger, maxSize: opts.MaxSize}
	if o.log == nil {
		o.log = slog.New(slog.DiscardHandler)
	}
	if o.maxSize <= 0 {
		o.maxSize = convert.SpoolLimit(convert.DefaultMaxVirtualSize)
	}
	switch o.maxSpool = opts.MaxSpool; {
	case o.maxSpool == 0:
		o.maxSpool = DefaultMaxSpool
	case o.maxSpool < 0:
		o.maxSpool = 0 // nothing may be spooled
	}
	if opts.HTTPClient != nil && (opts.CAFile != "" || opts.InsecureSkipVerify) {
		return nil, errors.New("CAFile and InsecureSkipVerify configure the default HTTP client; set them on Options.HTTPClient instead")
	}
	if o.tls, err = tlsConfig(opts.CAFile, opts.InsecureSkipVerify); err != nil {
		return nil, err
	}
	o.freeSpace = freeSpaceHook
	return o, nil
}

// verify compares a computed digest with Options.Checksum.
func (o *config) verify(digest string) error {
	if o.checksum != "" && o.checksum != digest {
		return &ChecksumError{Want: o.checksum, Got: digest}
	}
	return nil
}

// spool reads the original bytes from r once, front to back: through the
// hasher, through convert.Unwrap, and into a sparse temporary file capped at
// MaxSize and MaxSpool, or (Options.StreamRaw, not qcow2) through a size and
// data count only. An xz stream may go to the xz program instead, which
// writes the spool itself (openXZ). total is the announced size of r (-1 if
// unknown), for Progress and the checks before spooling. knownDigest, when
// not "", is the digest of r already known from the cache, and hashing is
// skipped.
func (o *config) spool(ctx context.Context, r io.Reader, total int64, knownDigest *string) (*Image, error) {
	src := &sourceReader{r: r, total: total, progress: o.Progress}
	var h hash.Hash
	if knownDigest == nil {
		h = sha256.New()
		src.hash = h
	}
	br := bufio.NewReaderSize(src, 64<<10)
	img, ok, err := o.openXZ(ctx, br)
	if !ok {
		img, err = o.unwrap(ctx, br, total, nil)
	}
	// A failure of the source itself (network, stdin) surfaces from a
	// decoder as a corrupt stream, or, when it wraps io.EOF or
	// io.ErrUnexpectedEOF as a cut download does, passes for the end of the
	// stream and would leave a short image; report what actually happened.
	// Only io.EOF itself ends a source.
	if src.err != nil && src.err != io.EOF {
		if err == nil {
			img.Close()
		}
		return nil, fmt.Errorf("reading: %w", src.err)
	}
	if err != nil {
		return nil, err
	}
	if img.Wrapper != convert.WrapperNone {
		// The decompressor may stop before the end of the original (trailing
		// padding); the digest covers every byte given, within the cap.
		if err := drain(src, o.maxSize); err != nil {
			img.Close()
			if src.err != nil && src.err != io.EOF {
				return nil, fmt.Errorf("reading: %w", src.err)
			}
			return nil, err
		}
	}
	img.OriginalSize = src.n
	if h != nil {
		img.Digest = "sha256:" + hex.EncodeToString(h.Sum(nil))
	} else {
		img.Digest = *knownDigest
	}
	if err := o.verify(img.Digest); err != nil {
		img.Close()
		return nil, err
	}
	o.log.Debug("opened stream", "wrapper", string(img.Wrapper), "bytes", img.Size, "original_bytes", img.OriginalSize,
		"digest", img.Digest, "streamed", img.Streamed)
	return img, nil
}

// unwrap decodes r with convert.UnwrapWith (xz with an xzDecoder), then
// spools or (Options.StreamRaw, not qcow2) streams the image. xzFile, when
// not nil, is the file r reads, at offset 0, which the xz program then
// reads itself.
func (o *config) unwrap(ctx context.Context, r io.Reader, total int64, xzFile *os.File) (img *Image, err error) {
	xz := o.newXZDecoder(xzFile)
	defer func() {
		// The xz program's own failure surfaces from convert as a corrupt
		// stream; report what actually happened.
		if toolErr := xz.toolErr(); err != nil && toolErr != nil {
			img, err = nil, toolErr
		}
	}()
	unwrapped, wrapper, err := convert.UnwrapWith(r, xz.unwrapOptions())
	if err != nil {
		return nil, err
	}
	defer unwrapped.Close()
	// The head decides between streaming and spooling; reading it costs at
	// most streamHead bytes of the unwrapped image.
	ib := bufio.NewReaderSize(unwrapped, streamHead)
	head, err := ib.Peek(streamHead)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, bufio.ErrBufferFull) {
		return nil, &reject.Error{Reason: reject.Wrapper, Detail: fmt.Sprintf("the %s stream is corrupt: %v", wrapper, err)}
	}
	if o.StreamRaw && !needsRandomAccess(head) {
		return o.stream(ctx, ib, wrapper)
	}
	return o.spoolFile(ctx, ib, wrapper, total)
}

// spoolFile copies the unwrapped stream r into a sparse temporary file.
// When the size is known (an unwrapped stream of announced size total), the
// spool cap and the free space are checked before a temporary file exists;
// otherwise both are checked as the bytes arrive.
func (o *config) spoolFile(ctx context.Context, r io.Reader, wrapper convert.Wrapper, total int64) (*Image, error) {
	if wrapper == convert.WrapperNone && total >= 0 {
		if total > o.maxSpool {
			return nil, spoolCapError(total, o.maxSpool)
		}
		if err := o.checkSpace(total); err != nil {
			return nil, err
		}
	}
	f, temp, err := createTemp(o.TempDir)
	if err != nil {
		return nil, err
	}
	img := &Image{ReaderAt: f, Wrapper: wrapper, file: f, temp: temp}
	guard := &spoolGuard{r: r, o: o, limit: o.maxSpool}
	img.Size, err = convert.Spool(ctx, guard, f, o.maxSize)
	if err != nil {
		img.Close()
		if guard.err != nil {
			return nil, guard.err
		}
		return nil, o.wordCap(err, wrapper)
	}
	return img, nil
}

// stream reads the unwrapped stream r to its end without storing it,
// keeping its head and tail for format detection.
func (o *config) stream(ctx context.Context, r io.Reader, wrapper convert.Wrapper) (*Image, error) {
	img := &Image{Wrapper: wrapper, Streamed: true}
	var tail tailKeeper
	var head []byte
	buf := make([]byte, 1<<20) // a multiple of dataBlock, so blocks stay aligned
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		n, err := io.ReadFull(r, buf)
		if n > 0 {
			// The spool cap applies although nothing is written, so that
			// inspect gives the verdict convert and import would.
			if img.Size+int64(n) > o.maxSpool {
				return nil, spoolCapError(-1, o.maxSpool)
			}
			if img.Size+int64(n) > o.maxSize {
				return nil, o.wordCap(&reject.Error{
					Reason: reject.Wrapper,
					Detail: fmt.Sprintf("the decompressed image exceeds %d bytes", o.maxSize),
				}, wrapper)
			}
			if len(head) < streamHead {
				head = append(head, buf[:min(n, streamHead-len(head))]...)
			}
			tail.keep(buf[:n])
			img.DataBytes += countData(buf[:n])
			img.Size += int64(n)
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			break
		}
		if err != nil {
			return nil, &reject.Error{Reason: reject.Wrapper, Detail: fmt.Sprintf("the compressed stream is corrupt: %v", err)}
		}
	}
	t := tail.bytes()
	img.ReaderAt = &streamView{head: head, tail: t, tailOff: img.Size - int64(len(t)), size: img.Size}
	return img, nil
}

// wordCap words a MaxSize rejection for the kind of stream it hit: the
// virtual size cap for an unwrapped stream, a wrapper that expands too far
// otherwise.
func (o *config) wordCap(err error, wrapper convert.Wrapper) error {
	if reject.As(err) == nil {
		return err
	}
	if wrapper == convert.WrapperNone {
		return &reject.Error{
			Reason: reject.VirtualSize,
			Detail: fmt.Sprintf("the image exceeds the limit of %d bytes", o.maxSize),
		}
	}
	return fmt.Errorf("decompressing (%s): %w", wrapper, err)
}

// drain reads src to its end, failing once it has delivered more than limit
// bytes in all.
func drain(src *sourceReader, limit int64) error {
	rest := limit - src.n
	if rest < 0 {
		rest = 0
	}
	n, err := io.Copy(io.Discard, io.LimitReader(src, rest+1))
	if err != nil {
		return err
	}
	if n > rest {
		return &reject.Error{
			Reason: reject.Wrapper,
			Detail: fmt.Sprintf("the compressed image exceeds %d bytes", limit),
		}
	}
	return nil
}

// sourceReader counts, hashes and reports the original bytes as they are
// read, and remembers the first error of the underlying reader.
type sourceReader struct {
	r        io.Reader
	hash     hash.Hash // nil when the digest is already known
	n        int64
	total    int64
	progress func(done, total int64)
	err      error
}

func (s *sourceReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if n > 0 {
		if s.hash != nil {
			s.hash.Write(p[:n])
		}
		s.n += int64(n)
		if s.progress != nil {
			s.progress(s.n, s.total)
		}
	}
	if err != nil && s.err == nil {
		s.err = err
	}
	return n, err
}

// createTemp creates an empty temporary file in dir and unlinks it at once,
// so it cannot outlive the process. When unlinking fails, it returns the
// path for Image.Close to remove.
func createTemp(dir string) (*os.File, string, error) {
	f, err := os.CreateTemp(dir, "imagepipe-source-*")
	if err != nil {
		return nil, "", fmt.Errorf("creating a temporary file: %w", err)
	}
	if err := os.Remove(f.Name()); err != nil {
		return f, f.Name(), nil
	}
	return f, "", nil
}
