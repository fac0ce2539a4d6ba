package registry

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/imagepipe/imagepipe/internal/cachefile"
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
	key    func() string // names the upload; nil or "" for none

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

// uploadState is what a state file remembers of an upload: the session
// to resume or, once the blob is committed, the blob and its labels.
type uploadState struct {
	path      string
	Key       string         `json:"key"`
	Repo      string         `json:"repository"`
	Location  string         `json:"location,omitempty"`
	Committed *committedBlob `json:"committed,omitempty"`
}

// committedBlob is a blob an upload committed, with the labels its
// writer gave it.
type committedBlob struct {
	Digest string            `json:"digest"`
	Labels map[string]string `json:"labels,omitempty"`
}

// Blob is what Upload sends into a repository.
type Blob struct {
	// Key, when set and returning non-"", names the upload so that a later
	// Upload of the same key into the same repository resumes it from
	// what the registry acknowledged, or, once it was committed, returns
	// the committed blob without writing it again (Uploaded.Earlier). It
	// may start naming the upload only while Write runs (a source still
	// being hashed). The state is kept in the client's cache directory.
	Key func() string
	// Prepare, when set, runs before an upload session is opened: a blob
	// it refuses costs the registry nothing.
	Prepare func(ctx context.Context) error
	// Digest, when known before the blob is written, makes a blob the
	// repository holds already cost one HEAD: Upload returns it
	// (Uploaded.Held) without Prepare or Write. Without Write (or
	// MountFrom), Upload only reports whether the repository holds it.
	Digest string
	// MountFrom, with Digest, is a repository of the same registry that
	// holds the blob: it is mounted from there where the registry allows
	// it, else streamed from there as stored, through this client.
	MountFrom *name.Repository
	// Write writes the blob to w and returns its digest ("sha256:<hex>")
	// and labels to record with it under Key. It is called again, from
	// the first byte, when the registry lost the upload session.
	Write func(ctx context.Context, w io.Writer) (digest string, labels map[string]string, err error)
	// Discard, when set, reports whether the session of a failed upload
	// is deleted (a refused blob, one found unnecessary) rather than kept
	// for a later run.
	Discard func(err error) bool
}

func (b Blob) key() string {
	if b.Key == nil {
		return ""
	}
	return b.Key()
}

// Uploaded is the outcome of an Upload.
type Uploaded struct {
	// Digest and Labels are the blob's, as Write returned them (or an
	// earlier run's Write, when Earlier).
	Digest string
	Labels map[string]string
	// Sent counts the bytes this run put on the wire, Resent those sent
	// more than once.
	Sent, Resent int64
	// Earlier reports that an earlier run committed the blob under the
	// same key and the registry still holds it: nothing was written.
	Earlier bool
	// Held reports that the repository held Blob.Digest already.
	Held bool
	// Forget, when set, drops the record of the blob committed under
	// Blob.Key: call it once the blob is referenced (by a manifest), after
	// which an upload of the same key writes again.
	Forget func()
}

// Upload streams a blob into repo through a resumable chunked upload. A
// failed or interrupted upload keeps its session (an error matching
// ErrResumable) unless Blob.Discard says otherwise; a session the
// registry lost is started again once, from the first byte. The blob is
// committed under the digest Write returns, which the registry checks.
func (c *Client) Upload(ctx context.Context, repo name.Repository, b Blob) (Uploaded, error) {
	if b.Digest != "" {
		if imageref.CheckDigest(b.Digest) != nil {
			return Uploaded{}, fmt.Errorf("uploading into %s: %q is not a sha256 digest", repo, b.Digest)
		}
		if b.MountFrom != nil {
			return Uploaded{Digest: b.Digest}, c.mountBlob(ctx, *b.MountFrom, repo, b.Digest)
		}
		held, err := c.holds(ctx, repo, b.Digest)
		switch {
		case err != nil:
			return Uploaded{}, err
		case held:
			return Uploaded{Digest: b.Digest, Held: true}, nil
		case b.Write == nil:
			return Uploaded{}, nil
		}
	}
	if b.Write == nil {
		return Uploaded{}, fmt.Errorf("uploading into %s: nothing to write", repo)
	}
	if up, ok := c.committedBlob(ctx, repo, b.key()); ok {
		c.opts.logger.Info("the blob was committed by an interrupted run", "repository", repo.Name(), "digest", up.Digest)
		return up, nil
	}
	if b.Prepare != nil {
		if err := b.Prepare(ctx); err != nil {
			return Uploaded{}, err
		}
	}
	up, err := c.uploadOnce(ctx, repo, b)
	if errors.Is(err, errUploadLost) {
		c.opts.logger.Info("upload session lost; sending the blob again", "repository", repo.Name(), "error", err)
		sent, resent := up.Sent, up.Resent
		up, err = c.uploadOnce(ctx, repo, b)
		up.Resent += resent + min(sent, up.Sent) // what the lost session had went again
		up.Sent += sent
	}
	if err != nil {
		return up, err
	}
	if path := c.statePath(repo, b.key()); path != "" &&
		c.writeState(&uploadState{path: path, Key: b.key(), Repo: repo.Name(), Committed: &committedBlob{Digest: up.Digest, Labels: up.Labels}}) {
		up.Forget = func() { os.Remove(path) }
	}
	return up, nil
}

// uploadOnce opens (or resumes) a session, has b written into it and
// commits it.
func (c *Client) uploadOnce(ctx context.Context, repo name.Repository, b Blob) (Uploaded, error) {
	up, err := c.startUpload(ctx, repo, b.Key)
	if err != nil {
		return Uploaded{}, err
	}
	up.run(ctx)
	digest, labels, err := b.Write(ctx, up)
	if err == nil {
		err = up.finish()
	} else {
		up.abort()
	}
	if err == nil {
		err = up.commit(ctx, digest)
	}
	res := Uploaded{Digest: digest, Labels: labels, Sent: up.sent, Resent: up.resent}
	if err != nil {
		res.Digest, res.Labels = "", nil
		if b.Discard != nil && b.Discard(err) {
			// Its bytes must not stay on the registry.
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			up.cancel(cctx)
			cancel()
			return res, err
		}
		// Interrupted or failed: the session stays, for a later run.
		if !errors.Is(err, errUploadLost) && up.saveState() {
			err = &resumableError{err}
		}
		return res, err
	}
	c.opts.logger.Debug("blob uploaded", "digest", digest, "sent", up.sent, "resent", up.resent)
	return res, nil
}

// ErrResumable marks an upload that stopped (interrupted, or the registry
// or the network failed) with its session kept and recorded, so that the
// same Upload run again resumes it.
var ErrResumable = errors.New("the upload is kept for a later run")

// resumableError wraps an upload's error when it can be resumed.
type resumableError struct{ err error }

func (e *resumableError) Error() string        { return e.err.Error() }
func (e *resumableError) Unwrap() error        { return e.err }
func (e *resumableError) Is(target error) bool { return target == ErrResumable }

// statePath is the state file of the upload key names in repo; "" when
// there is no cache directory or key is "".
func (c *Client) statePath(repo name.Repository, key string) string {
	if c.cache.dir == "" || key == "" {
		return ""
	}
	return filepath.Join(c.cache.dir, "uploads", stateFileName(repo.Name(), key))
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

// holds reports whether repo holds the blob dgst.
func (c *Client) holds(ctx context.Context, repo name.Repository, dgst string) (bool, error) {
	client, baseURL, err := c.httpClient(ctx, repo, repo.Scope(transport.PullScope))
	if err != nil {
		return false, err
	}
	return c.blobExists(ctx, client, baseURL, repo, dgst)
}

// committedBlob returns the blob an earlier run committed to repo under
// key when its record is this user's and the registry holds the blob.
func (c *Client) committedBlob(ctx context.Context, repo name.Repository, key string) (Uploaded, bool) {
	path := c.statePath(repo, key)
	if path == "" || c.cache.privateCachePath(path) == "" {
		return Uploaded{}, false
	}
	st, err := readUploadState(path)
	if err != nil || st.Key != key || st.Repo != repo.Name() || st.Committed == nil || imageref.CheckDigest(st.Committed.Digest) != nil {
		return Uploaded{}, false
	}
	if ok, err := c.holds(ctx, repo, st.Committed.Digest); err != nil || !ok {
		return Uploaded{}, false
	}
	return Uploaded{Digest: st.Committed.Digest, Labels: st.Committed.Labels, Earlier: true, Forget: func() { os.Remove(path) }}, true
}

// startUpload opens an upload session in repo, resuming the one a state
// file remembers for key when the registry still has it.
func (c *Client) startUpload(ctx context.Context, repo name.Repository, key func() string) (*blobUpload, error) {
	client, baseURL, err := c.httpClient(ctx, repo, repo.Scope(transport.PushScope))
	if err != nil {
		return nil, err
	}
	u := &blobUpload{c: c, client: client, base: baseURL, repo: repo, key: key}
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

// stateFileName names the state file of the upload key names in repo.
func stateFileName(repo, key string) string {
	return strings.NewReplacer("/", "_", ":", "_").Replace(repo) + "-" + fmt.Sprintf("%x", sha256.Sum256([]byte(key)))[:16] + ".json"
}

// maxStateFile bounds what is read of an upload state file.
const maxStateFile = 64 << 10

func readUploadState(path string) (*uploadState, error) {
	var s uploadState
	if err := cachefile.ReadJSON(path, maxStateFile, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// stateFile sets up the upload's state file once its key is known, and
// reports whether there is one.
func (u *blobUpload) stateFile() bool {
	if u.state == nil {
		if key := (Blob{Key: u.key}).key(); key != "" {
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

// smallBlob is the buffer a blob starts with when its first write is
// smaller: a config or a signature does not cost a whole chunk.
const smallBlob = 64 << 10

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
		u.free <- nil // allocated when first filled (see Write)
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
		k := min(len(p), u.c.opts.chunkSize-len(u.buf))
		if len(u.buf)+k > cap(u.buf) {
			// A small blob gets a small buffer; one that outgrows it gets
			// a whole chunk at once, not the garbage of growing by steps.
			size := u.c.opts.chunkSize
			if cap(u.buf) == 0 && k < smallBlob {
				size = min(smallBlob, size)
			}
			u.buf = append(make([]byte, 0, size), u.buf...)
		}
		u.buf = append(u.buf, p[:k]...)
		p = p[k:]
		if len(u.buf) == u.c.opts.chunkSize {
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
