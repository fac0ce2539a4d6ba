package registry

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"

	"github.com/imagepipe/imagepipe/internal/disktest"
)

func writeBytes(b []byte) func(context.Context, io.Writer) (string, map[string]string, error) {
	return func(_ context.Context, w io.Writer) (string, map[string]string, error) {
		_, err := w.Write(b)
		return digest.FromBytes(b).String(), map[string]string{"n": "1"}, err
	}
}

// blobRequests are the requests of rs under /v2/REPO/blobs/, as
// "METHOD PATH".
func blobRequests(rs []request) []string {
	var out []string
	for _, r := range rs {
		if strings.Contains(r.path, "/blobs/") {
			out = append(out, r.method+" "+r.path)
		}
	}
	return out
}

func countPrefix(lines []string, prefix string) int {
	n := 0
	for _, l := range lines {
		if strings.HasPrefix(l, prefix) {
			n++
		}
	}
	return n
}

// TestUploadKeepsWhatItPromises: a blob the repository holds costs one
// HEAD; a refused blob's session is deleted; a committed blob is
// returned, with its labels, to the next upload of its key without being
// written, until Forget.
func TestUploadKeepsWhatItPromises(t *testing.T) {
	host := disktest.Registry(t)
	var log requestLog
	c := testClient(t, WithRequestObserver(log.observe), WithChunkSize(1<<20))
	repo := disktest.MustTag(t, host+"/acme/blobs:1").Context()
	blob := bytes.Repeat([]byte("imagepipe"), 300000) // three chunks
	key := func() string { return "the-key" }

	up, err := c.Upload(t.Context(), repo, Blob{Key: key, Write: writeBytes(blob)})
	if err != nil || up.Digest != digest.FromBytes(blob).String() || up.Sent != int64(len(blob)) || up.Earlier || up.Held {
		t.Fatalf("first upload: %+v, %v", up, err)
	}
	if n := countPrefix(blobRequests(log.take()), "PATCH "); n != 3 {
		t.Errorf("the blob went up in %d PATCHes, want 3 of 1 MiB", n)
	}

	written := false
	again, err := c.Upload(t.Context(), repo, Blob{Key: key, Write: func(ctx context.Context, w io.Writer) (string, map[string]string, error) {
		written = true
		return writeBytes(blob)(ctx, w)
	}})
	if err != nil || !again.Earlier || written || again.Digest != up.Digest || again.Labels["n"] != "1" || again.Forget == nil {
		t.Fatalf("upload of a committed key: %+v (written %v), %v; want the earlier blob, not written", again, written, err)
	}
	if sent := blobRequests(log.take()); countPrefix(sent, "POST ")+countPrefix(sent, "PATCH ") != 0 {
		t.Errorf("upload of a committed key sent %v", sent)
	}
	again.Forget()
	if after, err := c.Upload(t.Context(), repo, Blob{Key: key, Write: writeBytes(blob)}); err != nil || after.Earlier {
		t.Errorf("after Forget: %+v, %v; want a fresh upload", after, err)
	}
	blobRequests(log.take())

	held, err := c.Upload(t.Context(), repo, Blob{Digest: up.Digest, Write: writeBytes(blob)})
	if err != nil || !held.Held {
		t.Errorf("upload of a held digest: %+v, %v", held, err)
	}
	if sent := blobRequests(log.take()); len(sent) != 1 || !strings.HasPrefix(sent[0], "HEAD ") {
		t.Errorf("upload of a held digest sent %v, want one HEAD", sent)
	}
	for _, bad := range []string{"sha256:../../globex/evil", "sha256:" + strings.Repeat("A", 64), "md5:0"} {
		if _, err := c.Upload(t.Context(), repo, Blob{Digest: bad, Write: writeBytes(blob)}); err == nil {
			t.Errorf("upload with the digest %q was taken", bad)
		}
	}
	if sent := blobRequests(log.take()); len(sent) != 0 {
		t.Errorf("uploads with malformed digests sent %v", sent)
	}
	if _, err := c.Upload(t.Context(), repo, Blob{}); err == nil {
		t.Error("an upload with nothing to write succeeded")
	}
	missing := digest.FromString("absent").String()
	if probe, err := c.Upload(t.Context(), repo, Blob{Digest: missing}); err != nil || probe.Held {
		t.Errorf("probe of an absent blob: %+v, %v", probe, err)
	}

	refused := errors.New("refused")
	_, err = c.Upload(t.Context(), repo, Blob{Key: func() string { return "refused" },
		Write:   func(context.Context, io.Writer) (string, map[string]string, error) { return "", nil, refused },
		Discard: func(err error) bool { return errors.Is(err, refused) }})
	if !errors.Is(err, refused) || errors.Is(err, ErrResumable) {
		t.Errorf("refused blob: %v; want the refusal, not resumable", err)
	}
	sent := blobRequests(log.take())
	if countPrefix(sent, "POST ") != 1 || countPrefix(sent, "DELETE ") != 1 {
		t.Errorf("refused blob: %v; want its session opened and deleted", sent)
	}
	if _, err := c.Upload(t.Context(), repo, Blob{Write: func(context.Context, io.Writer) (string, map[string]string, error) {
		return "", nil, http.ErrHandlerTimeout
	}}); err == nil {
		t.Error("an upload whose writer failed succeeded")
	}
}
