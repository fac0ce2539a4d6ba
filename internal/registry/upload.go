package registry

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/imagepipe/imagepipe/internal/cachefile"
	"github.com/imagepipe/imagepipe/internal/containerdisk"
	"github.com/imagepipe/imagepipe/internal/imageref"
)

// errUploadLost means the registry no longer knows the upload session; the
// blob has to be sent again from its first byte.
var errUploadLost = errors.New("the registry lost the upload session")

// blobUpload is a resumable chunked blob upload (distribution spec: POST,
// PATCH with Content-Range, PUT ?digest=). It is an io.Writer: bytes are
// gathered into chunks, and while one chunk is in flight the next fills.
// When a PATCH fails, the upload's status tells how many bytes the registry
// holds, and sending resumes from there; only the unacknowledged part of
// the current chunk is sent again.
type blobUpload struct {
	c      *Client
	client *http.Client
	base   *url.URL
	repo   name.Repository
	key    *uploadKey

	location *url.URL // the upload URL; it changes with every response
	acked    int64    // bytes the registry holds
	skip     int64    // bytes a previous run already uploaded
	pos      int64    // bytes written to the upload so far
	resent   int64    // bytes sent more than once
	sent     int64    // bytes sent in this run
	buf      []byte
	state    *uploadState
	progress func(acked int64)

	chunks  chan chunk    // full chunks for the sender
	free    chan []byte   // chunk buffers the sender is done with
	failed  chan struct{} // closed when the sender gives up
	failErr error         // why, once failed is closed
	result  chan error    // the sender's outcome
}

// uploadState is what a state file remembers of an interrupted upload:
// the session to resume, or, once the layer is committed and until its
// manifest is put, the layer.
type uploadState struct {
	path     string
	Key      string          `json:"key"`
	Repo     string          `json:"repository"`
	Location string          `json:"location,omitempty"`
	Layer    *committedLayer `json:"layer,omitempty"`
}

// committedLayer is a layer the registry holds whose image is not written
// yet.
type committedLayer struct {
	containerdisk.LayerInfo
	Allocated int64 `json:"allocated"`
}

// statePath is the state file of the upload key names in repo; "" when
// there is no cache directory or key is "".
func (c *Client) statePath(repo name.Repository, key string) string {
	if c.cache.dir == "" || key == "" {
		return ""
	}
	return filepath.Join(c.cache.dir, "uploads", stateFileName(repo.Name(), key))
}

// rememberCommitted records b's committed layer under its upload key, so
// that a run stopped before the manifest does not upload it again.
// Failing to is not an error.
func (c *Client) rememberCommitted(repo name.Repository, b built) {
	path := c.statePath(repo, b.upload)
	if path == "" {
		return
	}
	c.writeState(&uploadState{path: path, Key: b.upload, Repo: repo.Name(), Layer: &committedLayer{LayerInfo: b.layer, Allocated: b.allocated}})
}

// writeState writes st to its file, in the private cache directory only,
// and reports whether it did.
func (c *Client) writeState(st *uploadState) bool {
	data, _ := json.Marshal(st)
	if err := os.MkdirAll(filepath.Dir(st.path), 0o700); err != nil || c.cache.privateCachePath(st.path) == "" {
		return false
	}
	return cachefile.WriteFile(st.path, data) == nil
}

// forgetCommitted removes the record of rememberCommitted once the
// manifest is put.
func (c *Client) forgetCommitted(repo name.Repository, key string) {
	if path := c.statePath(repo, key); path != "" {
		os.Remove(path)
	}
}

// committedLayer returns the layer an earlier run committed to repo under
// key when its record is this user's and the registry holds the blob.
func (c *Client) committedLayer(ctx context.Context, repo name.Repository, key string) (built, bool) {
	path := c.statePath(repo, key)
	if path == "" || c.cache.privateCachePath(path) == "" {
		return built{}, false
	}
	st, err := readUploadState(path)
	if err != nil || st.Key != key || st.Repo != repo.Name() || st.Layer == nil ||
		imageref.CheckDigest(st.Layer.Digest) != nil || imageref.CheckDigest(st.Layer.DiffID) != nil || st.Layer.Size <= 0 || st.Layer.Allocated < 0 {
		return built{}, false
	}
	client, base, err := c.httpClient(ctx, repo, repo.Scope(transport.PullScope))
	if err != nil {
		return built{}, false
	}
	baseURL, err := url.Parse(base)
	if err != nil {
		return built{}, false
	}
	if ok, err := c.blobExists(ctx, client, baseURL, repo, st.Layer.Digest); err != nil || !ok {
		return built{}, false
	}
	return built{layer: st.Layer.LayerInfo, allocated: st.Layer.Allocated, upload: key}, true
}

// startUpload opens an upload session in repo, resuming the one a state
// file remembers for key when the registry still has it.
// uploadKey names an upload so that a later run can resume it: the build
// key, known at once or, while the source is still being hashed, later.
// A nil *uploadKey names nothing.
type uploadKey struct{ v atomic.Pointer[string] }

func knownKey(key string) *uploadKey {
	k := new(uploadKey)
	k.set(key)
	return k
}

func (k *uploadKey) set(key string) { k.v.Store(&key) }

func (k *uploadKey) get() string {
	if k == nil {
		return ""
	}
	if p := k.v.Load(); p != nil {
		return *p
	}
	return ""
}

func (c *Client) startUpload(ctx context.Context, repo name.Repository, key *uploadKey) (*blobUpload, error) {
	client, base, err := c.httpClient(ctx, repo, repo.Scope(transport.PushScope))
	if err != nil {
		return nil, err
	}
	baseURL, err := url.Parse(base)
	if err != nil {
		return nil, err
	}
	u := &blobUpload{c: c, client: client, base: baseURL, repo: repo, key: key, buf: make([]byte, 0, c.opts.chunkSize)}
	if u.stateFile() && c.cache.privateCachePath(u.state.path) != "" {
		// A state file only names an upload session of this repository on
		// this registry: the layer's bytes never go where else it points.
		if prev, err := readUploadState(u.state.path); err == nil && prev.Key == u.state.Key && prev.Repo == repo.Name() {
			if loc, err := baseURL.Parse(prev.Location); err == nil && loc.Scheme == baseURL.Scheme && loc.Host == baseURL.Host &&
				strings.HasPrefix(loc.Path, "/v2/"+repo.RepositoryStr()+"/blobs/uploads/") && !strings.Contains(loc.Path, "/../") {
				u.location = loc
				if err := u.status(ctx); err == nil {
					u.skip = u.acked
					c.opts.logger.Info("resuming upload", "repository", repo.Name(), "bytes", u.acked)
					return u, nil
				}
				c.opts.logger.Debug("previous upload is gone; starting again", "repository", repo.Name())
			}
		}
	}
	resp, err := u.do(ctx, http.MethodPost, baseURL.JoinPath("v2", repo.RepositoryStr(), "blobs", "uploads").String()+"/", nil, nil)
	if err != nil {
		return nil, fmt.Errorf("starting blob upload: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		return nil, fmt.Errorf("starting blob upload: %w", transport.CheckError(resp, http.StatusAccepted))
	}
	if err := u.follow(resp); err != nil {
		return nil, err
	}
	u.saveState()
	return u, nil
}

func stateFileName(repo, key string) string {
	return strings.NewReplacer("/", "_", ":", "_").Replace(repo) + "-" + strings.TrimPrefix(key, "sha256:")[:16] + ".json"
}

// maxStateFile bounds what is read of an upload state file.
const maxStateFile = 64 << 10

func readUploadState(path string) (*uploadState, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var s uploadState
	if err := json.NewDecoder(&limitedReader{r: f, n: maxStateFile}).Decode(&s); err != nil {
		return nil, err
	}
	return &s, nil
}

// stateFile sets up the upload's state file once its key is known, and
// reports whether there is one.
func (u *blobUpload) stateFile() bool {
	if u.state == nil {
		if key := u.key.get(); key != "" {
			if path := u.c.statePath(u.repo, key); path != "" {
				u.state = &uploadState{path: path, Key: key, Repo: u.repo.Name()}
			}
		}
	}
	return u.state != nil
}

// saveState records the current upload URL and reports whether it did;
// failing to is not an error, it only costs a later run the ability to
// resume.
func (u *blobUpload) saveState() bool {
	if !u.stateFile() || u.location == nil {
		return false
	}
	u.state.Location = u.location.String()
	return u.c.writeState(u.state)
}

func (u *blobUpload) forgetState() {
	if u.state != nil {
		os.Remove(u.state.path)
	}
}

// follow takes the new upload URL and acknowledged size from a response.
func (u *blobUpload) follow(resp *http.Response) error {
	loc, err := u.base.Parse(resp.Header.Get("Location"))
	if err != nil || resp.Header.Get("Location") == "" {
		return fmt.Errorf("the registry sent no valid upload location (%q)", resp.Header.Get("Location"))
	}
	u.location = loc
	if r := resp.Header.Get("Range"); r != "" {
		end, err := parseRangeEnd(r)
		if err != nil {
			return err
		}
		u.acked = end
	}
	return nil
}

// parseRangeEnd turns a "0-N" Range header into the size N+1. Registries
// answer "0-0" for an empty upload.
func parseRangeEnd(r string) (int64, error) {
	_, last, ok := strings.Cut(strings.TrimPrefix(r, "bytes="), "-")
	n, err := strconv.ParseInt(last, 10, 64)
	if !ok || err != nil || n < 0 {
		return 0, fmt.Errorf("the registry sent an invalid Range header %q", r)
	}
	if n == 0 {
		return 0, nil
	}
	return n + 1, nil
}

// chunk is a piece of the blob and its offset in the blob.
type chunk struct {
	data  []byte
	start int64
}

// run starts the sender that PATCHes chunks in order; finish stops it.
// Three chunk buffers circulate: one filling, one queued, one in flight.
func (u *blobUpload) run(ctx context.Context) {
	u.chunks = make(chan chunk, 1)
	u.failed = make(chan struct{})
	u.result = make(chan error, 1)
	u.free = make(chan []byte, 2)
	for range 2 {
		u.free <- make([]byte, 0, cap(u.buf))
	}
	go func() {
		for c := range u.chunks {
			err := u.sendChunk(ctx, c.data, c.start)
			u.free <- c.data[:0]
			if err != nil {
				u.failErr = err
				close(u.failed)
				for range u.chunks { // let Write and finish return
				}
				u.result <- err
				return
			}
		}
		u.result <- nil
	}()
}

// Write gathers p into chunks and queues each full one; one chunk is sent
// while the next fills.
func (u *blobUpload) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		k := min(len(p), cap(u.buf)-len(u.buf))
		u.buf = append(u.buf, p[:k]...)
		p = p[k:]
		if len(u.buf) == cap(u.buf) {
			if err := u.queue(); err != nil {
				return n - len(p), err
			}
		}
	}
	return n, nil
}

// queue hands the buffered bytes to the sender, skipping what a previous
// run already uploaded.
func (u *blobUpload) queue() error {
	c := chunk{data: u.buf, start: u.pos}
	u.pos += int64(len(u.buf))
	if c.start+int64(len(c.data)) <= u.skip {
		u.buf = u.buf[:0]
		return nil
	}
	select {
	case u.chunks <- c:
	case <-u.failed:
		return u.failErr
	}
	select {
	case u.buf = <-u.free:
		return nil
	case <-u.failed:
		return u.failErr
	}
}

// finish sends what is buffered and waits for every chunk to be acknowledged.
func (u *blobUpload) finish() error {
	var err error
	if len(u.buf) > 0 {
		err = u.queue()
	}
	close(u.chunks)
	if serr := <-u.result; serr != nil {
		return serr
	}
	return err
}

// sendChunk PATCHes chunk (stream offset start), resuming after failures
// from whatever the registry acknowledged.
func (u *blobUpload) sendChunk(ctx context.Context, chunk []byte, start int64) error {
	end := start + int64(len(chunk))
	var lastErr error
	for attempt := 0; attempt < u.c.opts.retries; attempt++ {
		if attempt > 0 {
			if err := sleep(ctx, u.c.opts.backoff<<(attempt-1)); err != nil {
				return err
			}
			if err := u.status(ctx); err != nil {
				if errors.Is(err, errUploadLost) {
					return err
				}
				lastErr = err
				continue
			}
		}
		if u.acked >= end {
			return nil
		}
		if u.acked < start {
			return fmt.Errorf("%w: it holds %d bytes, but bytes from %d on were already acknowledged", errUploadLost, u.acked, start)
		}
		from := u.acked
		body := chunk[from-start:]
		if attempt > 0 {
			u.resent += int64(len(body))
		}
		u.sent += int64(len(body)) // on the wire, whether or not it arrives
		header := http.Header{
			"Content-Type":  {"application/octet-stream"},
			"Content-Range": {fmt.Sprintf("%d-%d", from, end-1)},
		}
		resp, err := u.do(ctx, http.MethodPatch, u.location.String(), header, body)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			lastErr = err
			u.c.opts.logger.Debug("chunk upload failed; resuming", "offset", from, "error", err)
			continue
		}
		if resp.StatusCode != http.StatusAccepted {
			lastErr = transport.CheckError(resp, http.StatusAccepted)
			resp.Body.Close()
			if !retryableStatus(resp.StatusCode) && resp.StatusCode != http.StatusRequestedRangeNotSatisfiable {
				return fmt.Errorf("uploading bytes %d-%d: %w", from, end-1, lastErr)
			}
			continue
		}
		resp.Body.Close()
		if err := u.follow(resp); err != nil {
			return err
		}
		if u.acked != end {
			lastErr = fmt.Errorf("the registry holds %d bytes after a chunk ending at %d", u.acked, end)
			continue
		}
		u.saveState()
		if u.progress != nil {
			u.progress(u.acked)
		}
		return nil
	}
	return fmt.Errorf("uploading bytes %d-%d after %d tries: %w", start, end-1, u.c.opts.retries, lastErr)
}

// status asks the registry how many bytes of the upload it holds.
func (u *blobUpload) status(ctx context.Context) error {
	resp, err := u.do(ctx, http.MethodGet, u.location.String(), nil, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusNoContent, http.StatusOK:
		return u.follow(resp)
	case http.StatusNotFound:
		return errUploadLost
	}
	return transport.CheckError(resp, http.StatusNoContent)
}

// abort stops the sender without sending what is buffered.
func (u *blobUpload) abort() {
	close(u.chunks)
	<-u.result
}

// cancel deletes the upload session: for rejected or abandoned images,
// whose partial bytes must not stay on the registry.
func (u *blobUpload) cancel(ctx context.Context) {
	if resp, err := u.do(ctx, http.MethodDelete, u.location.String(), nil, nil); err == nil {
		resp.Body.Close()
	}
	u.forgetState()
}

// commit completes the upload as digest, after finish.
func (u *blobUpload) commit(ctx context.Context, digest string) error {
	var lastErr error
	for attempt := 0; attempt < u.c.opts.retries; attempt++ {
		if attempt > 0 {
			if err := sleep(ctx, u.c.opts.backoff<<(attempt-1)); err != nil {
				return err
			}
			if ok, err := u.c.blobExists(ctx, u.client, u.base, u.repo, digest); err == nil && ok {
				break // an earlier PUT did commit
			}
		}
		loc := *u.location
		q := loc.Query()
		q.Set("digest", digest)
		loc.RawQuery = q.Encode()
		resp, err := u.do(ctx, http.MethodPut, loc.String(), nil, nil)
		if err != nil {
			lastErr = err
			continue
		}
		if resp.StatusCode == http.StatusCreated {
			resp.Body.Close()
			lastErr = nil
			break
		}
		lastErr = transport.CheckError(resp, http.StatusCreated) // reads the body's error codes
		resp.Body.Close()
		var terr *transport.Error
		if errors.As(lastErr, &terr) && terr.StatusCode == http.StatusBadRequest && hasCode(terr, transport.DigestInvalidErrorCode) {
			// What the registry holds is not this layer (a session resumed
			// from a stale or foreign state file): start over.
			u.cancel(ctx)
			return fmt.Errorf("%w: %v", errUploadLost, lastErr)
		}
		if !retryableStatus(resp.StatusCode) {
			break
		}
	}
	if lastErr != nil {
		return fmt.Errorf("completing the blob upload: %w", lastErr)
	}
	u.forgetState()
	return nil
}

// do sends one request with an in-memory body.
func (u *blobUpload) do(ctx context.Context, method, target string, header http.Header, body []byte) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, target, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	req.ContentLength = int64(len(body))
	return u.client.Do(req)
}

// blobExists reports whether repo has the blob.
func (c *Client) blobExists(ctx context.Context, client *http.Client, base *url.URL, repo name.Repository, digest string) (bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodHead, base.JoinPath("v2", repo.RepositoryStr(), "blobs", digest).String(), nil)
	if err != nil {
		return false, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return false, err
	}
	resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
		return true, nil
	case http.StatusNotFound:
		return false, nil
	}
	return false, transport.CheckError(resp, http.StatusOK)
}

// retryableStatus: 408, 429 and 5xx are worth another try.
func retryableStatus(code int) bool {
	return code == http.StatusRequestTimeout || code == http.StatusTooManyRequests || code >= 500
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// hasCode reports whether the registry's error response carries one of
// codes.
func hasCode(terr *transport.Error, codes ...transport.ErrorCode) bool {
	for _, d := range terr.Errors {
		for _, c := range codes {
			if d.Code == c {
				return true
			}
		}
	}
	return false
}
