package registry

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/imagepipe/imagepipe/internal/containerdisk"
	"github.com/imagepipe/imagepipe/internal/convert"
	"github.com/imagepipe/imagepipe/internal/publish"
	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// TestInterruptedImportResumes stops imagectl import with SIGINT and with
// SIGTERM while its layer upload is known to be in flight: a proxy holds
// the upload once 20 MiB have passed (two 8 MiB chunks acknowledged, the
// third under way), and the signal is sent then. The import exits 130 or
// 143 saying how to resume, leaves no tag, and the same command run again
// sends only what the registry does not hold and pushes the same image as
// an uninterrupted import.
func TestInterruptedImportResumes(t *testing.T) {
	testenv.RequireQEMU(t)
	const mib = 1 << 20
	raw := makeDisk(t, t.TempDir(), 64, 40, "raw")
	clean := harness.StartRegistry(t, harness.RegistryOptions{})
	want := importOK(t, t.TempDir(), raw, clean.Host+"/acme/disk:1", "--compression", "none")

	for _, tc := range []struct {
		name string
		sig  syscall.Signal
		code int
	}{{"SIGINT", syscall.SIGINT, 130}, {"SIGTERM", syscall.SIGTERM, 143}} {
		t.Run(tc.name, func(t *testing.T) {
			reg := harness.StartRegistry(t, harness.RegistryOptions{})
			proxy := harness.StartPauseProxy(t, reg.Host, 20*mib)
			cache := t.TempDir()
			ref := proxy.Addr + "/acme/disk:1"
			interruptImport(t, proxy, cache, tc.sig, tc.code, raw, ref, "--compression", "none")
			if tags := reg.Tags(t, "acme/disk"); len(tags) != 0 {
				t.Fatalf("tags after the interrupt: %v", tags)
			}

			before := proxy.Forwarded()
			res := importOK(t, cache, raw, ref, "--compression", "none")
			sent := proxy.Forwarded() - before
			t.Logf("layer %d bytes; the second run sent %d layer bytes, %d bytes in all", res.LayerSize, res.UploadedBytes, sent)
			if res.Digest != want.Digest || res.Reused {
				t.Errorf("resumed import: %+v, want digest %s", res, want.Digest)
			}
			// At least the two acknowledged chunks stay on the registry.
			if res.UploadedBytes > res.LayerSize-16*mib || sent > res.LayerSize-16*mib+mib {
				t.Errorf("the second run sent %d layer bytes (%d on the wire) of %d: it did not resume", res.UploadedBytes, sent, res.LayerSize)
			}
			disk := pullWithSkopeo(t, reg.Host+"/acme/disk:1")
			testenv.Run(t, "qemu-img", "compare", "-q", "-f", "raw", raw, disk)
		})
	}
}

// interruptImport runs imagectl import with args through proxy, sends it
// sig once the proxy holds the upload, checks the exit code and message,
// and drops the held connection.
func interruptImport(t *testing.T, proxy *harness.PauseProxy, cache string, sig syscall.Signal, code int, args ...string) {
	t.Helper()
	cmd := exec.Command(testenv.Imagectl, append([]string{"import", "--quiet", "-o", "json"}, args...)...)
	cmd.Env = append(os.Environ(), "IMAGEPIPE_CACHE="+cache)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case <-proxy.Reached():
	case err := <-exited:
		t.Fatalf("the import ended before the proxy paused it: %v\n%s", err, stderr.String())
	}
	if err := cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	<-exited
	if got := cmd.ProcessState.ExitCode(); got != code || !strings.Contains(stderr.String(), "interrupted; run the same command again to resume") {
		t.Fatalf("after %v: exit %d, stderr %q; want %d and the resume hint", sig, got, stderr.String(), code)
	}
	proxy.Drop()
}

// TestTamperedUploadStartsOver: someone appends bytes to the upload
// session an interrupted import left (its URL is in the state file). The
// re-run resumes, the registry refuses the layer's digest, and imagectl
// sends the layer again from the start: the image is right.
func TestTamperedUploadStartsOver(t *testing.T) {
	testenv.RequireQEMU(t)
	const mib = 1 << 20
	raw := makeDisk(t, t.TempDir(), 32, 20, "raw")
	reg := harness.StartRegistry(t, harness.RegistryOptions{})
	want := importOK(t, t.TempDir(), raw, reg.Host+"/acme/clean:1", "--compression", "none")
	proxy := harness.StartPauseProxy(t, reg.Host, 12*mib)
	cache := t.TempDir()
	ref := proxy.Addr + "/acme/disk:1"
	interruptImport(t, proxy, cache, syscall.SIGINT, 130, raw, ref, "--compression", "none")

	states, _ := filepath.Glob(filepath.Join(cache, "uploads", "*.json"))
	if len(states) != 1 {
		t.Fatalf("state files %v, want one", states)
	}
	var state struct{ Location string }
	b, _ := os.ReadFile(states[0])
	if err := json.Unmarshal(b, &state); err != nil || state.Location == "" {
		t.Fatalf("state file %s: %v", b, err)
	}
	appendToSession(t, reg.Host, strings.Replace(state.Location, proxy.Addr, reg.Host, 1), bytes.Repeat([]byte{0xee}, mib))

	res := importOK(t, cache, raw, ref, "--compression", "none")
	t.Logf("layer %d bytes, the re-run sent %d", res.LayerSize, res.UploadedBytes)
	// It resumed (sending the rest), was refused, and sent it all again.
	if res.Digest != want.Digest || res.UploadedBytes <= res.LayerSize {
		t.Errorf("re-run after tampering: %+v, want digest %s and the whole layer sent again after the rest", res, want.Digest)
	}
	disk := pullWithSkopeo(t, reg.Host+"/acme/disk:1")
	testenv.Run(t, "qemu-img", "compare", "-q", "-f", "raw", raw, disk)
}

// appendToSession plays someone who appends data to an upload session
// behind imagectl's back: it asks the registry how far the session is and
// sends data from there. The interrupted import's last request may still
// be settling in the registry when the test starts, which moves the
// session's end; a 416 then means "ask again", up to a few times.
func appendToSession(t *testing.T, host, session string, data []byte) {
	t.Helper()
	const attempts = 20
	for i := range attempts {
		resp, err := http.Get(session)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		var last int64
		if _, err := fmt.Sscanf(resp.Header.Get("Range"), "0-%d", &last); err != nil {
			t.Fatalf("upload status %d, Range %q", resp.StatusCode, resp.Header.Get("Range"))
		}
		loc := session
		if l := resp.Header.Get("Location"); l != "" { // the registry's URL for the next request
			if strings.HasPrefix(l, "/") {
				l = "http://" + host + l
			}
			loc = l
		}
		req, _ := http.NewRequest(http.MethodPatch, loc, bytes.NewReader(data))
		req.Header.Set("Content-Type", "application/octet-stream")
		req.Header.Set("Content-Range", fmt.Sprintf("%d-%d", last+1, last+int64(len(data))))
		resp, err = http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		switch {
		case resp.StatusCode == http.StatusAccepted:
			return
		case resp.StatusCode == http.StatusRequestedRangeNotSatisfiable && i < attempts-1:
			time.Sleep(50 * time.Millisecond) // let the interrupted request settle
		default:
			t.Fatalf("appending to the session at %d: HTTP %d", last+1, resp.StatusCode)
		}
	}
}

// errStopped stands for a signal in TestInterruptBeforeTheDigestResumes.
var errStopped = errors.New("stopped by the test")

// TestInterruptBeforeTheDigestResumes interrupts, through the library, an
// import whose source is still being hashed (so its build key is not
// known yet) after 12 MiB of the layer were built: with an upload name (a
// local file's identity, as imagectl gives) the upload is kept and a later
// run resumes it; without one it is not resumable.
func TestInterruptBeforeTheDigestResumes(t *testing.T) {
	const mib = 1 << 20
	reg := harness.StartRegistry(t, harness.RegistryOptions{})
	rawPath := makeDisk(t, t.TempDir(), 32, 16, "raw")
	f, err := os.Open(rawPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	size := fileSize(t, rawPath)
	img, err := convert.Open(f, size, convert.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	digest := "sha256:" + sha256File(t, rawPath)
	hashing := func(ctx context.Context) (string, error) { <-ctx.Done(); return "", ctx.Err() } // never done in time
	cdisk, err := containerdisk.NewDisk(img, containerdisk.Options{DiskFormat: convert.FormatRaw, Compression: containerdisk.CompressionNone})
	if err != nil {
		t.Fatal(err)
	}
	opts := func(progress func(done, total int64)) publish.ImportOptions {
		return publish.ImportOptions{Progress: progress}
	}
	interrupt := func(t *testing.T, c *registry.Client, ref name.Tag, uploadName string) error {
		ctx, cancel := context.WithCancelCause(t.Context())
		defer cancel(nil)
		_, err := (&publish.Importer{Registry: c}).Import(ctx, ref, cdisk, origin{wait: hashing, uploadName: uploadName},
			opts(func(done, _ int64) {
				if done >= 12*mib {
					cancel(errStopped)
				}
			}))
		if !errors.Is(err, errStopped) {
			t.Fatalf("interrupted import: %v", err)
		}
		return err
	}

	ref, err := name.NewTag(reg.Host + "/acme/early:1")
	if err != nil {
		t.Fatal(err)
	}
	c, err := registry.New(registry.WithCacheDir(t.TempDir()), registry.WithChunkSize(mib))
	if err != nil {
		t.Fatal(err)
	}
	if err := interrupt(t, c, ref, "file:/images/disk.raw:1:2:3:4:5"); !errors.Is(err, registry.ErrResumable) {
		t.Fatalf("with an upload name: %v, want a resumable upload", err)
	}
	res, err := (&publish.Importer{Registry: c}).Import(t.Context(), ref, cdisk, origin{digest: digest, uploadName: "file:/images/disk.raw:1:2:3:4:5"}, opts(nil))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("layer %d bytes; the second run sent %d", res.LayerSize, res.UploadedBytes)
	// The sender is at most three 1 MiB chunks behind the build.
	if res.UploadedBytes > res.LayerSize-9*mib {
		t.Errorf("the second run sent %d of %d layer bytes: it did not resume", res.UploadedBytes, res.LayerSize)
	}
	disk := pullWithSkopeo(t, reg.Host+"/acme/early:1")
	if sha256File(t, disk) != strings.TrimPrefix(digest, "sha256:") {
		t.Error("the resumed image's disk differs from the source")
	}

	other, err := registry.New(registry.WithCacheDir(t.TempDir()), registry.WithChunkSize(mib))
	if err != nil {
		t.Fatal(err)
	}
	otherRef, _ := name.NewTag(reg.Host + "/acme/early:2")
	if err := interrupt(t, other, otherRef, ""); errors.Is(err, registry.ErrResumable) {
		t.Errorf("without an upload name nor a digest: %v, want no resumable upload", err)
	}
}

// origin is a registry.Source: a digest known at once, or one still being
// computed (wait), and an upload name.
type origin struct {
	digest     string
	wait       func(context.Context) (string, error)
	uploadName string
}

func (o origin) WaitDigest(ctx context.Context) (string, error) {
	if o.wait != nil {
		return o.wait(ctx)
	}
	return o.digest, nil
}

func (o origin) DigestDeferred() bool { return o.wait != nil }
func (o origin) UploadName() string   { return o.uploadName }
