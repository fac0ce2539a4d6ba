package registry

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/imagepipe/imagepipe/internal/convert"
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
			args := []string{"import", "--quiet", "-o", "json", raw, ref, "--compression", "none"}

			cmd := exec.Command(testenv.Imagectl, args...)
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
				t.Fatalf("the import ended before the upload reached 20 MiB: %v\n%s", err, stderr.String())
			}
			if err := cmd.Process.Signal(tc.sig); err != nil {
				t.Fatal(err)
			}
			<-exited
			if code := cmd.ProcessState.ExitCode(); code != tc.code || !strings.Contains(stderr.String(), "interrupted; run the same command again to resume") {
				t.Fatalf("after %s: exit %d, stderr %q; want %d and the resume hint", tc.name, code, stderr.String(), tc.code)
			}
			proxy.Drop()
			if tags := listTags(t, reg.Host, "acme/disk"); len(tags) != 0 {
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
	opts := func(progress func(done, total int64)) registry.ImportOptions {
		return registry.ImportOptions{DiskFormat: convert.FormatRaw, Compression: registry.CompressionNone, Progress: progress}
	}
	interrupt := func(t *testing.T, c *registry.Client, ref name.Tag, uploadName string) error {
		ctx, cancel := context.WithCancelCause(t.Context())
		defer cancel(nil)
		_, err := c.Import(ctx, ref, registry.Source{Image: img, WaitDigest: hashing, UploadName: uploadName},
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
	res, err := c.Import(t.Context(), ref, registry.Source{Image: img, Digest: digest, UploadName: "file:/images/disk.raw:1:2:3:4:5"}, opts(nil))
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
