package registry

import (
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/imagepipe/imagepipe/internal/disktest"
)

// TestCopyProgress: Copy reports the bytes it copies, of an image and of
// an index, to another registry; a copy dst already holds reports
// without hanging, and a failing one returns.
func TestCopyProgress(t *testing.T) {
	from, to := disktest.Registry(t), disktest.Registry(t)
	c := testClient(t)
	img, err := random.Image(1<<20, 3)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := random.Index(256<<10, 2, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(disktest.MustTag(t, from+"/acme/img:1"), img); err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(disktest.MustTag(t, from+"/acme/idx:1"), idx); err != nil {
		t.Fatal(err)
	}
	for _, repo := range []string{"img", "idx"} {
		t.Run(repo, func(t *testing.T) {
			src := disktest.MustTag(t, from+"/acme/"+repo+":1")
			dst := disktest.MustTag(t, to+"/acme/"+repo+":1")
			var log disktest.Progress
			if _, err := c.Copy(t.Context(), src, dst, CopyOptions{Progress: log.Report}); err != nil {
				t.Fatal(err)
			}
			// Three layers of 1 MiB, or two images of two 256 KiB layers.
			if total := log.Finished(t, "copy"); total < 1<<20 {
				t.Errorf("total %d bytes, less than the layers copied", total)
			}
			// dst holds it all now: nothing to send, and nothing to wait for.
			var again disktest.Progress
			if _, err := c.Copy(t.Context(), src, dst, CopyOptions{Progress: again.Report}); err != nil {
				t.Fatal(err)
			}
		})
	}
	bad, err := name.NewTag("127.0.0.1:1/acme/img:1", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	var log disktest.Progress
	fast := testClient(t, WithRetry(1, 1))
	if _, err := fast.Copy(t.Context(), disktest.MustTag(t, from+"/acme/img:1"), bad, CopyOptions{Progress: log.Report}); err == nil {
		t.Error("copy to an unreachable registry succeeded")
	}
}
