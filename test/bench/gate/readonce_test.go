package gate

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"golang.org/x/sys/unix"

	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// readOnceDisk is the raw disk the ReadOnce layer declares.
const readOnceDisk = 8 << 30

// benchReadOnce is the ReadOnce part: one run-length zstd layer declaring
// an 8 GiB raw disk, pushed to a fresh gate under a first manifest, then
// two more manifests that differ from it only in their annotations (one in
// another tenant's repository), then an OCI index of eight platforms, each
// its own manifest and config, all naming the layer. For each step: the
// CPU time of the gate and its verification children, and the gate's full
// reads of the layer. The store (--state-dir) should make every step after
// the first cost no read and a small fraction of its CPU time.
func benchReadOnce(t testing.TB) string {
	layers, err := newRLELayers(readOnceDisk, 0x5a, []byte{0x5a})
	if err != nil {
		t.Fatal(err)
	}
	layer := layers[0]
	reg := harness.StartRegistry(t, harness.RegistryOptions{Gate: testenv.ImageGate,
		// One verification spools the whole disk (a raw disk is checked in
		// a file); the default share of the spool, a sixth of 90% of the
		// free space, may be less on a full disk.
		GateArgs: []string{"--max-spool", fmt.Sprint(6 * (readOnceDisk + 1<<30))}})
	requireFree(t, reg.Gate.Args, readOnceDisk+2<<30)
	pid := reg.Gate.Pid()
	amd64 := v1.Platform{OS: "linux", Architecture: "amd64"}
	image := func(copy string) v1.Image {
		img, err := rleImage(layer, amd64, map[string]string{"io.imagepipe.bench/copy": copy})
		if err != nil {
			t.Fatal(err)
		}
		return img
	}

	type step struct {
		what  string
		cpu   cpuTime
		reads int
		secs  float64 // the gate's time to its slowest verdict of the step
	}
	var steps []step
	cpu, reads := treeCPU(t, pid), 0
	// measure pushes each image (by tag), waits for their verdicts, and
	// records what the gate spent since the last step.
	measure := func(what string, pushes map[string]func(name.Reference) string) {
		digests := map[string]string{}
		for tag, push := range pushes {
			digests[tag] = push(ref(t, reg.Host+"/"+tag))
		}
		var secs float64
		for tag, d := range digests {
			repo, _, _ := strings.Cut(tag, ":")
			secs = max(secs, waitVerdict(t, reg.Gate.LogPath, d, repo))
		}
		now, n := treeCPU(t, pid), blobReads(t, reg.LogPath(), layer.digest.String(), "imagepipe-gate/")
		steps = append(steps, step{what, now.sub(cpu), n - reads, secs})
		cpu, reads = now, n
	}
	pushImage := func(img v1.Image) func(name.Reference) string {
		return func(r name.Reference) string {
			if err := remote.Write(r, img, remote.WithContext(t.Context())); err != nil {
				t.Fatal(err)
			}
			d, err := img.Digest()
			if err != nil {
				t.Fatal(err)
			}
			return d.String()
		}
	}
	measure("first manifest", map[string]func(name.Reference) string{"tenant-a/readonce:1": pushImage(image("1"))})
	measure("two more manifests", map[string]func(name.Reference) string{
		"tenant-a/readonce:2": pushImage(image("2")), "tenant-b/readonce:1": pushImage(image("3")),
	})
	idx, err := rleIndex(layer, indexPlatforms)
	if err != nil {
		t.Fatal(err)
	}
	measure("index", map[string]func(name.Reference) string{"tenant-b/index:1": func(r name.Reference) string {
		if err := remote.WriteIndex(r, idx, remote.WithContext(t.Context())); err != nil {
			t.Fatal(err)
		}
		d, err := idx.Digest()
		if err != nil {
			t.Fatal(err)
		}
		return d.String()
	}})

	first := steps[0].cpu.total().Seconds()
	var b strings.Builder
	fmt.Fprintf(&b, "\nRead once: one zstd layer of run-length blocks (%d KB) declaring a raw disk of %d GiB of one non-zero byte, pushed with go-containerregistry to a fresh gate: under a first manifest, then under two more that differ only in their annotations (one in another tenant's repository), then in an OCI index of %d linux platforms, each its own manifest and config, all naming the layer. CPU time of the gate and its verification children (user and system, from /proc, children that ended included); reads are the registry's completed GETs of the layer by the gate, in any repository. Before the gate kept a store (issue 34), the two later steps cost 6.8 and 20 times the first (65 and 193 CPU-s against 9.5): each manifest and platform read the layer again.\n\n",
		len(layer.blob)/1000, readOnceDisk>>30, len(indexPlatforms))
	fmt.Fprintf(&b, "| case | measured | target | |\n| --- | ---: | ---: | --- |\n")
	fmt.Fprintf(&b, "| first manifest: gate CPU | %.2f s (user %.2f, system %.2f) | | |\n", first, steps[0].cpu.user.Seconds(), steps[0].cpu.sys.Seconds())
	fmt.Fprintf(&b, "| first manifest: the gate's time to its verdict | %.2f s | | |\n", steps[0].secs)
	fmt.Fprintf(&b, "| first manifest: full reads of the layer | %d | 1 | %s |\n", steps[0].reads, verdict(steps[0].reads == 1))
	for _, s := range steps[1:] {
		share := s.cpu.total().Seconds() / first
		fmt.Fprintf(&b, "| %s: gate CPU | %.2f s = %.3f of the first | ≤ 0.05 of the first | %s |\n", s.what, s.cpu.total().Seconds(), share, verdict(share <= 0.05))
		fmt.Fprintf(&b, "| %s: reads of the layer | %d | 0 | %s |\n", s.what, s.reads, verdict(s.reads == 0))
	}
	return b.String()
}

// ref parses a reference to the test's plain-HTTP registry.
func ref(t testing.TB, s string) name.Reference {
	t.Helper()
	r, err := name.ParseReference(s, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// requireFree fails unless the gate's --temp-dir (in args) has bytes free.
func requireFree(t testing.TB, args []string, bytes int64) {
	t.Helper()
	dir := ""
	for i, a := range args[:len(args)-1] {
		if a == "--temp-dir" {
			dir = args[i+1]
		}
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatalf("reading the free space of the gate's --temp-dir: %v", err)
	}
	if free := int64(st.Bavail) * int64(st.Bsize); free < bytes {
		t.Fatalf("the gate's --temp-dir %s has %d GiB free; this part spools %d GiB", dir, free>>30, bytes>>30)
	}
}
