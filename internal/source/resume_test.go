package source_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/imagepipe/imagepipe/internal/reject"
	"github.com/imagepipe/imagepipe/internal/source"
	"github.com/imagepipe/imagepipe/test/harness"
)

// inverted returns data with every bit flipped: a new version of an object
// of the same size, whose every byte differs from the old one.
func inverted(data []byte) []byte {
	b := make([]byte, len(data))
	for i, c := range data {
		b[i] = ^c
	}
	return b
}

// assertNotSpliced fails when a download that started on old and may have
// ended on new returned anything but one of them whole.
func assertNotSpliced(t *testing.T, img *source.Image, old, new []byte) {
	t.Helper()
	switch got := readAll(t, img); {
	case bytes.Equal(got, old), bytes.Equal(got, new):
	case len(got) == len(old):
		t.Errorf("opened a splice of the old and the new object (%d bytes, digest %s)", len(got), img.Digest)
	default:
		t.Errorf("opened %d bytes of an object of %d", len(got), len(old))
	}
}

// version is one version of an object as an HTTP server describes it.
type version struct {
	data     []byte
	etag     string    // "" for none
	modified time.Time // zero for no Last-Modified
}

// changingObject plays a web server whose object is replaced while it is
// downloaded: the first GET gets the old version's headers and half its
// body before the connection drops, and from then on the server holds the
// new version, served with Range and If-Range support (http.ServeContent).
// It records the If-Range header of every range request.
type changingObject struct {
	old, new version
	// ignoresIfRange serves ranges of the new version whatever If-Range
	// says, as some servers and caches do.
	ignoresIfRange bool

	mu      sync.Mutex
	cut     bool
	ifRange []string
}

func (c *changingObject) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	first := !c.cut
	c.cut = true
	if r.Header.Get("Range") != "" {
		c.ifRange = append(c.ifRange, r.Header.Get("If-Range"))
	}
	c.mu.Unlock()
	if first {
		if c.old.etag != "" {
			w.Header().Set("ETag", c.old.etag)
		}
		if !c.old.modified.IsZero() {
			w.Header().Set("Last-Modified", c.old.modified.UTC().Format(http.TimeFormat))
		}
		w.Header().Set("Accept-Ranges", "bytes")
		w.Header().Set("Content-Length", strconv.Itoa(len(c.old.data)))
		w.WriteHeader(http.StatusOK)
		w.Write(c.old.data[:len(c.old.data)/2])
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // drops the connection mid-body
	}
	if c.new.etag != "" {
		w.Header().Set("ETag", c.new.etag)
	}
	if c.ignoresIfRange {
		r.Header.Del("If-Range")
	}
	http.ServeContent(w, r, "disk", c.new.modified, bytes.NewReader(c.new.data))
}

// TestOpenHTTPResumeChecksTheRangesVersion: a server that ignores If-Range
// and answers the resume with a range of the new version names that
// version in its 206; the open fails instead of splicing it on.
func TestOpenHTTPResumeChecksTheRangesVersion(t *testing.T) {
	source.SetResumeBackoff(t, time.Millisecond)
	oldData := imageBytes(4<<20 + 7)
	newData := inverted(oldData)
	t1 := time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)
	for name, pair := range map[string][2]version{
		"strong ETag":   {{oldData, `"v1"`, time.Time{}}, {newData, `"v2"`, time.Time{}}},
		"Last-Modified": {{oldData, "", t1}, {newData, "", t1.Add(time.Hour)}},
		"size":          {{oldData, `"v1"`, time.Time{}}, {append(slices.Clone(oldData), 1), "", time.Time{}}},
	} {
		t.Run(name, func(t *testing.T) {
			srv := httptest.NewServer(&changingObject{old: pair[0], new: pair[1], ignoresIfRange: true})
			defer srv.Close()
			tmp := t.TempDir()
			img, err := source.Open(t.Context(), srv.URL+"/disk.raw", source.Options{TempDir: tmp})
			if err == nil {
				img.Close()
				t.Fatal("opened a download whose resume came from another version")
			}
			if !strings.Contains(err.Error(), "changed") {
				t.Errorf("err = %v, want one saying the object changed", err)
			}
			assertEmpty(t, tmp)
		})
	}
}

// checkResumeOutcome checks how Open ended (img, err) for a download of
// oldData, cut mid-way, whose resume found newData: an unchanged object
// opens whole with its digest; a changed one fails, not as a rejection,
// and leaves tmp empty, its error saying "changed" when sayChanged; never
// a splice of the two.
func checkResumeOutcome(t *testing.T, img *source.Image, err error, oldData, newData []byte, tmp string, sayChanged bool) {
	t.Helper()
	changed := !bytes.Equal(oldData, newData)
	switch {
	case err == nil:
		defer img.Close()
		assertNotSpliced(t, img, oldData, newData)
		if changed {
			t.Errorf("opened an object that changed during the download")
		} else if img.Digest != digestOf(oldData) {
			t.Errorf("digest %s, want %s", img.Digest, digestOf(oldData))
		}
	case changed:
		if reject.As(err) != nil {
			t.Errorf("a changed object was reported as a rejection: %v", err)
		}
		if sayChanged && !strings.Contains(err.Error(), "changed") {
			t.Errorf("err = %v, want one saying the object changed", err)
		}
		assertEmpty(t, tmp)
	default:
		t.Errorf("resuming an unchanged object: %v", err)
	}
}

// TestOpenHTTPResumePinned: a download cut mid-way resumes with If-Range
// naming the version it started on (its strong ETag, else its
// Last-Modified), so that an object replaced in between fails the open
// instead of splicing the new version's tail onto the old one's head; an
// unchanged object resumes whole. A download with nothing to pin a resume
// to is not resumed.
func TestOpenHTTPResumePinned(t *testing.T) {
	source.SetResumeBackoff(t, time.Millisecond)
	oldData := imageBytes(4<<20 + 7) // cut at half: past the 1 MiB head Open peeks at, so only the spool can notice
	newData := inverted(oldData)
	t1 := time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)
	t2 := t1.Add(time.Hour)
	date := func(t time.Time) string { return t.Format(http.TimeFormat) }

	for _, tc := range []struct {
		name     string
		old, new version
		// ifRange is what the one range request must carry; "none" wants
		// no range request at all.
		ifRange string
	}{
		{"strong ETag, changed", version{oldData, `"v1"`, time.Time{}}, version{newData, `"v2"`, time.Time{}}, `"v1"`},
		{"Last-Modified, changed", version{oldData, "", t1}, version{newData, "", t2}, date(t1)},
		{"weak ETag, changed", version{oldData, `W/"v1"`, t1}, version{newData, `W/"v2"`, t2}, date(t1)},
		{"strong ETag, unchanged", version{oldData, `"v1"`, t1}, version{oldData, `"v1"`, t1}, `"v1"`},
		{"weak ETag, unchanged", version{oldData, `W/"v1"`, t1}, version{oldData, `W/"v1"`, t1}, date(t1)},
		{"no validator, changed", version{oldData, "", time.Time{}}, version{newData, "", time.Time{}}, "none"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &changingObject{old: tc.old, new: tc.new}
			srv := httptest.NewServer(h)
			defer srv.Close()
			tmp := t.TempDir()
			img, err := source.Open(t.Context(), srv.URL+"/disk.raw", source.Options{TempDir: tmp})
			checkResumeOutcome(t, img, err, tc.old.data, tc.new.data, tmp, tc.ifRange != "none")
			h.mu.Lock()
			defer h.mu.Unlock()
			switch {
			case tc.ifRange == "none" && len(h.ifRange) > 0:
				t.Errorf("resumed with If-Range %q from a download with no ETag or Last-Modified", h.ifRange)
			case tc.ifRange != "none" && (len(h.ifRange) != 1 || h.ifRange[0] != tc.ifRange):
				t.Errorf("range requests had If-Range %q, want one with %q", h.ifRange, tc.ifRange)
			}
		})
	}
}

// TestOpenHTTPCutNeverShort: a download of an unwrapped image cut mid-way
// that cannot be resumed (no Range support, or every resume failing) fails
// the open, whether spooled or streamed; it never passes as an image of
// the bytes that arrived.
func TestOpenHTTPCutNeverShort(t *testing.T) {
	source.SetResumeBackoff(t, time.Millisecond)
	data := imageBytes(2 << 20)
	for _, ranges := range []bool{false, true} {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("ranges=%v/stream=%v", ranges, stream), func(t *testing.T) {
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if r.Header.Get("Range") != "" {
						panic(http.ErrAbortHandler) // every resume dies before the response
					}
					w.Header().Set("ETag", `"v1"`)
					if ranges {
						w.Header().Set("Accept-Ranges", "bytes")
					}
					w.Header().Set("Content-Length", strconv.Itoa(len(data)))
					w.WriteHeader(http.StatusOK)
					w.Write(data[:len(data)/2])
					w.(http.Flusher).Flush()
					panic(http.ErrAbortHandler)
				}))
				defer srv.Close()
				tmp := t.TempDir()
				img, err := source.Open(t.Context(), srv.URL+"/disk.raw", source.Options{TempDir: tmp, StreamRaw: stream})
				if err == nil {
					t.Errorf("opened %d bytes of a download of %d", img.Size, len(data))
					img.Close()
					return
				}
				if reject.As(err) != nil {
					t.Errorf("a network failure was reported as a rejection: %v", err)
				}
				assertEmpty(t, tmp)
			})
		}
	}
}

// dropsFirstGet plays a network between imagepipe and a real S3 server
// that drops the first download of an object after cut bytes of its body,
// calling onCut first (nil: nothing happens meanwhile). It records the
// Range and If-Match headers of every GET of the object, and the ETag the
// first one was answered with.
type dropsFirstGet struct {
	inner http.RoundTripper
	path  string
	cut   int64
	onCut func() error

	mu        sync.Mutex
	gets      []http.Header
	firstETag string
	cutErr    error
}

func (d *dropsFirstGet) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodGet || req.URL.Path != d.path {
		return d.inner.RoundTrip(req)
	}
	d.mu.Lock()
	first := len(d.gets) == 0
	d.gets = append(d.gets, http.Header{"Range": req.Header.Values("Range"), "If-Match": req.Header.Values("If-Match")})
	d.mu.Unlock()
	resp, err := d.inner.RoundTrip(req)
	if err != nil || !first {
		return resp, err
	}
	d.mu.Lock()
	d.firstETag = resp.Header.Get("ETag")
	d.mu.Unlock()
	resp.Body = &droppedBody{ReadCloser: resp.Body, left: d.cut, d: d}
	return resp, nil
}

// droppedBody is a response body that fails after left bytes with
// io.ErrUnexpectedEOF, as Go's transport reports a body cut short of its
// Content-Length.
type droppedBody struct {
	io.ReadCloser
	left int64
	d    *dropsFirstGet
}

func (b *droppedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		if b.d.onCut != nil {
			err := b.d.onCut()
			b.d.onCut = nil
			b.d.mu.Lock()
			b.d.cutErr = err
			b.d.mu.Unlock()
		}
		return 0, io.ErrUnexpectedEOF
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	return n, err
}

// TestOpenS3ResumePinned: an S3 download cut mid-way resumes from the
// first byte not read with If-Match naming the ETag it started on: an
// unchanged object is read whole, and one overwritten in between fails the
// open, saying that it changed, instead of splicing the two versions.
func TestOpenS3ResumePinned(t *testing.T) {
	source.SetResumeBackoff(t, time.Millisecond)
	m := harness.StartMinIO(t)
	dir := t.TempDir()
	oldData := imageBytes(4<<20 + 7) // cut at half: past the 1 MiB head Open peeks at, so only the spool can notice
	newData := inverted(oldData)
	oldPath := writeFile(t, dir, "old.raw", oldData)
	newPath := writeFile(t, dir, "new.raw", newData)
	transport, err := minio.DefaultTransport(false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(transport.CloseIdleConnections)
	uploader, err := minio.New(m.Endpoint, &minio.Options{Creds: credentials.NewStaticV4(m.AccessKey, m.SecretKey, ""), Transport: transport})
	if err != nil {
		t.Fatal(err)
	}
	s3 := source.S3Options{Endpoint: m.Endpoint, AccessKey: m.AccessKey, SecretKey: m.SecretKey, Region: "us-east-1", Insecure: true}
	cut := int64(len(oldData) / 2)

	for _, changed := range []bool{false, true} {
		t.Run(fmt.Sprintf("changed=%v", changed), func(t *testing.T) {
			key := fmt.Sprintf("disk-%v.raw", changed)
			m.PutFile(t, "images", key, oldPath)
			net := &dropsFirstGet{inner: transport, path: "/images/" + key, cut: cut}
			if changed {
				ctx := t.Context()
				net.onCut = func() error {
					_, err := uploader.FPutObject(ctx, "images", key, newPath, minio.PutObjectOptions{})
					return err
				}
			}
			tmp := t.TempDir()
			img, err := source.Open(t.Context(), "s3://images/"+key, source.Options{TempDir: tmp, S3: s3, HTTPClient: &http.Client{Transport: net}})
			net.mu.Lock()
			defer net.mu.Unlock()
			if net.cutErr != nil {
				t.Fatalf("replacing the object during the download: %v", net.cutErr)
			}
			served := oldData
			if changed {
				served = newData
			}
			checkResumeOutcome(t, img, err, oldData, served, tmp, true)
			if len(net.gets) != 2 {
				t.Fatalf("%d GETs of the object (%v), want the first and one resume", len(net.gets), net.gets)
			}
			if net.firstETag == "" {
				t.Fatal("the first GET was answered without an ETag")
			}
			want := http.Header{"Range": {"bytes=" + strconv.FormatInt(cut, 10) + "-"}, "If-Match": {net.firstETag}}
			if got := net.gets[1]; fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("the resume had headers %v, want %v", got, want)
			}
		})
	}
}
