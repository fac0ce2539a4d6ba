package source

import (
	"context"
	"crypto/sha256"
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
)

// Options configures Open. The zero value opens any spec with the defaults
// documented on each field.
type Options struct {
	// Checksum, when set, is the expected digest of the original bytes,
	// "sha256:<hex>". Open fails with a *ChecksumError when it does not match.
	Checksum string
	// TempDir is where spooled copies go; "" means os.TempDir().
	TempDir string
	// MaxSize caps the bytes spooled or unwrapped, and the announced size of
	// a download; 0 means convert.SpoolLimit(convert.DefaultMaxVirtualSize).
	// An unwrapped local file is not copied and not capped here: the disk
	// engine checks its virtual size.
	MaxSize int64
	// S3 configures s3:// sources; empty fields fall back to the AWS_*
	// environment variables.
	S3 S3Options
	// HTTPClient fetches http(s):// sources and, through its Transport,
	// s3:// sources. nil means a client with connect, TLS and response
	// header timeouts but no overall timeout, since images are large. At most
	// 5 redirects are followed unless the client sets its own CheckRedirect.
	HTTPClient *http.Client
	// Logger receives debug messages and one info message per resumed
	// download; nil discards them.
	Logger *slog.Logger
	// DeferDigest lets Open return at once for an unwrapped local file whose
	// digest is not cached, hashing it in the background while the caller
	// already reads the image; Image.WaitDigest then gives the digest.
	DeferDigest bool
	// SkipDigest lets Open leave Image.Digest empty for an unwrapped local
	// file, which is then not read at all (inspect and convert do not need
	// the digest). Other sources are read once anyway and get a digest.
	SkipDigest bool
	// Progress, when set, is called from Open's goroutine as source bytes
	// are read during its sequential pass, with the bytes read so far and the
	// total (-1 when unknown). It is not called when the digest of an
	// unwrapped local file comes from the cache, since nothing is read.
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

	closeOnce sync.Once
	closeErr  error
	file      *os.File // the file behind ReaderAt

	// A digest being computed in the background (Options.DeferDigest).
	hashed     chan struct{} // closed when Digest or hashErr is set
	hashErr    error
	cancelHash context.CancelFunc
	temp       string // a temporary file still to remove, when unlinking it early failed
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
		return nil, fmt.Errorf("opening %s: %w", displayName(spec), err)
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

// displayName is how errors name a spec: stdin by that name, URLs without
// their password and query string, since presigned URLs carry credentials
// there.
func displayName(spec string) string {
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
// hasher, through convert.Unwrap, into a sparse temporary file capped at
// MaxSize. total is the announced size of r (-1 if unknown), for Progress.
// knownDigest, when not "", is the digest of r already known from the cache,
// and hashing is skipped.
func (o *config) spool(ctx context.Context, r io.Reader, total int64, knownDigest *string) (*Image, error) {
	src := &sourceReader{r: r, total: total, progress: o.Progress}
	var h hash.Hash
	if knownDigest == nil {
		h = sha256.New()
		src.hash = h
	}
	fail := func(err error) (*Image, error) {
		// A failure of the source itself (network, stdin) surfaces from
		// convert as a corrupt stream; report what actually happened.
		if src.err != nil && !errors.Is(src.err, io.EOF) {
			return nil, fmt.Errorf("reading: %w", src.err)
		}
		return nil, err
	}

	inner, wrapper, err := convert.Unwrap(src)
	if err != nil {
		return fail(err)
	}
	defer inner.Close()

	f, temp, err := createTemp(o.TempDir)
	if err != nil {
		return nil, err
	}
	img := &Image{ReaderAt: f, Wrapper: wrapper, file: f, temp: temp}
	img.Size, err = convert.Spool(ctx, inner, f, o.maxSize)
	if err == nil && wrapper != convert.WrapperNone {
		// The decompressor may stop before the end of the original (trailing
		// padding); the digest covers every byte given, within the cap.
		err = drain(src, o.maxSize)
	}
	if err != nil {
		img.Close()
		if convert.AsReject(err) != nil && src.err == nil {
			if wrapper == convert.WrapperNone {
				// Spool words its cap for decompressed streams.
				err = &convert.RejectError{
					Reason: convert.ReasonVirtualSize,
					Detail: fmt.Sprintf("the image exceeds the limit of %d bytes", o.maxSize),
				}
			} else {
				err = fmt.Errorf("decompressing (%s): %w", wrapper, err)
			}
		}
		return fail(err)
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
	o.log.Debug("spooled image", "wrapper", string(wrapper), "bytes", img.Size, "original_bytes", img.OriginalSize, "digest", img.Digest)
	return img, nil
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
		return &convert.RejectError{
			Reason: convert.ReasonWrapper,
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
