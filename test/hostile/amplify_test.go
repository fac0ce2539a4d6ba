package hostile

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/imagepipe/imagepipe/internal/reject"
	"github.com/imagepipe/imagepipe/pkg/api"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// Images whose tables make a small file claim far more data than it holds,
// and images that only decompression finds broken: imagectl inspect,
// convert and import must reach the same verdict on each, with exit code 3
// and the reason code, and import must send nothing to the registry.
var amplifyCases = []struct {
	name  string
	build builder
	want  reject.Reason
}{
	// The image: qemu-img's 2 TiB qcow2 with one data cluster, then
	// every L1 entry pointed at the one L2 table and every L2 entry at the
	// one data cluster: 2 TiB of "data" in 384 KiB.
	{"amplify/2TiB-one-table-one-cluster", shared("2T", true, true), reject.SharedCluster},
	{"amplify/2TiB-one-table", shared("2T", true, false), reject.SharedL2Table},
	{"amplify/16GiB-one-cluster", shared("16G", false, true), reject.SharedCluster},
	// qcow2 metadata read as guest data, and guest data read as metadata.
	{"metadata/data-cluster-is-its-l2-table", patched(plainQCOW2, dataAtOwnL2Table), reject.MetadataOverlap},
	{"metadata/l2-table-is-the-l1-table", patched(plainQCOW2, l2AtL1Table), reject.MetadataOverlap},
	// qemu-img's compressed image with every L2 entry set to the first
	// compressed descriptor.
	{"compressed/one-descriptor-for-every-cluster", patched(compressedQCOW2, copyL2Entry0(16)), reject.SharedCluster},
	// Found only by decompressing the cluster.
	{"compressed/garbage-data", patched(compressedQCOW2, garbleCompressedCluster0), reject.CompressedCluster},
	// Valid zstd streams, as short as the format allows: 512 MiB of guest
	// data in 362 KiB, more than deflate could ever pack.
	{"compressed/zstd-bomb", zstdBomb, reject.CompressionRatio},
	// qemu-img rounds sizes up to 512; QEMU reads 512 bytes of this one.
	{"virtual-size/1000-bytes", patched(qcow2Sized("1000"), setU64(offSize, 1000)), reject.VirtualSize},
}

func TestAmplifyingImagesRejectedByEveryCommand(t *testing.T) {
	testenv.RequireQEMU(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{})
	for i, tc := range amplifyCases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := tc.build(t, dir)
			code := fmt.Sprintf("(%s)", tc.want)

			exit, out, stderr := testenv.Exit(t, testenv.Imagectl, "inspect", "-o", "json", path)
			var r api.ImageReport
			if err := json.Unmarshal([]byte(out), &r); err != nil {
				t.Fatalf("inspect exit %d, output %q: %v\n%s", exit, out, err, stderr)
			}
			if exit != 3 || r.Verdict != api.VerdictRejected || len(r.Reasons) != 1 || r.Reasons[0].Code != string(tc.want) {
				t.Errorf("inspect: exit %d, report %+v; want exit 3 and %s", exit, r, tc.want)
			} else {
				t.Logf("inspect: %s", r.Reasons[0].Message)
			}

			for _, to := range []string{"qcow2", "raw"} {
				dst := filepath.Join(dir, "out."+to)
				exit, _, stderr := testenv.Exit(t, testenv.Imagectl, "convert", "--to", to, path, dst)
				if exit != 3 || !strings.Contains(stderr, code) {
					t.Errorf("convert --to %s: exit %d, stderr %q; want 3 and %s", to, exit, stderr, tc.want)
				}
				if _, err := os.Stat(dst); !os.IsNotExist(err) {
					t.Errorf("convert --to %s left %s behind", to, dst)
				}
			}

			for _, format := range []string{"qcow2", "raw"} {
				repo := fmt.Sprintf("acme/amplify-%d-%s", i, format)
				res := testenv.RunCommand(t, testenv.Command{
					Name: testenv.Imagectl,
					Args: []string{"import", "--quiet", "-o", "json", "--disk-format", format, path, reg.Host + "/" + repo + ":1"},
					Env:  []string{"IMAGEPIPE_CACHE=" + t.TempDir()},
				})
				if res.Code != 3 || !strings.Contains(res.Stderr, code) {
					t.Errorf("import --disk-format %s: exit %d, stderr %q; want 3 and %s", format, res.Code, res.Stderr, tc.want)
				}
				assertNothingSent(t, reg, repo)
			}
		})
	}
	// The check above sees writes: a valid image's import makes some.
	good := compressedQCOW2(t, t.TempDir())
	res := testenv.RunCommand(t, testenv.Command{
		Name: testenv.Imagectl,
		Args: []string{"import", "--quiet", good, reg.Host + "/acme/amplify-control:1"},
		Env:  []string{"IMAGEPIPE_CACHE=" + t.TempDir()},
	})
	if res.Code != 0 {
		t.Fatalf("import of a valid compressed image: exit %d: %s", res.Code, res.Stderr)
	}
	if writes := registryWrites(t, reg, "acme/amplify-control"); len(writes) == 0 {
		t.Errorf("no write found in the registry log for a successful import; the log format changed")
	}
}

// assertNothingSent checks that the registry holds no tag for repo and was
// sent no blob or manifest for it: no PATCH or PUT in its log, and no upload
// session left open. imagectl's push-permission check before reading the
// source opens one session and deletes it at once; that is all it may do.
func assertNothingSent(t *testing.T, reg *harness.Registry, repo string) {
	t.Helper()
	if tags := repoTags(t, reg, repo); len(tags) > 0 {
		t.Errorf("%s has tags after a rejected import: %v", repo, tags)
	}
	opened, closed := 0, 0
	for _, r := range registryRequests(t, reg, repo) {
		switch {
		case r.method == "PATCH" || r.method == "PUT":
			t.Errorf("the registry was sent a write for %s: %s", repo, r.line)
		case r.method == "POST":
			opened++
		case r.method == "DELETE" && strings.Contains(r.line, "/blobs/uploads/"):
			closed++
		}
	}
	if opened > closed {
		t.Errorf("%d upload sessions for %s were opened and %d deleted: a rejected import left one open", opened, repo, closed)
	}
}

// registryWrites returns the registry's log lines for POST, PATCH and PUT
// requests to repo.
func registryWrites(t *testing.T, reg *harness.Registry, repo string) []string {
	var writes []string
	for _, r := range registryRequests(t, reg, repo) {
		if r.method == "POST" || r.method == "PATCH" || r.method == "PUT" {
			writes = append(writes, r.line)
		}
	}
	return writes
}

type loggedRequest struct{ method, line string }

// registryRequests returns the requests to repo in the registry's log.
func registryRequests(t *testing.T, reg *harness.Registry, repo string) []loggedRequest {
	t.Helper()
	f, err := os.Open(reg.LogPath())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var reqs []loggedRequest
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, "msg=\"response completed\"") {
			continue
		}
		if !strings.Contains(line, "http.request.uri=\"/v2/"+repo+"/") && !strings.Contains(line, "http.request.uri=/v2/"+repo+"/") {
			continue
		}
		for _, m := range []string{"PATCH", "PUT", "POST", "DELETE", "GET", "HEAD"} {
			if strings.Contains(line, "http.request.method="+m+" ") {
				reqs = append(reqs, loggedRequest{m, line})
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return reqs
}

// repoTags lists the tags of repo, none when it does not exist.
func repoTags(t *testing.T, reg *harness.Registry, repo string) []string {
	t.Helper()
	dir := filepath.Join(reg.RootDir, "docker", "registry", "v2", "repositories", repo, "_manifests", "tags")
	entries, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var tags []string
	for _, e := range entries {
		tags = append(tags, e.Name())
	}
	return tags
}

// TestQEMUCompressedImagesStillAccepted is the control: images qemu-img
// writes with -c, byte-packed, for both compression types and several
// cluster sizes, pass inspect and convert to the same bytes as qemu-img;
// and a raw disk of an odd size reads as qemu reads it, padded to 512.
func TestQEMUCompressedImagesStillAccepted(t *testing.T) {
	testenv.RequireQEMU(t)
	dir := t.TempDir()
	raw := filepath.Join(dir, "disk.raw")
	testenv.Run(t, "qemu-img", "create", "-q", "-f", "raw", raw, "6M")
	testenv.Run(t, "qemu-io", "-f", "raw",
		"-c", "write -P 0x61 0 1M", // one byte repeated: the shortest streams
		"-c", "write -P 0xff 1M 17k",
		"-c", "write -P 0x00 2M 64k",
		raw)
	// Text-like data compresses to streams of varied lengths.
	text := strings.Repeat("the quick brown fox jumps over the lazy dog 0123456789\n", 60000)
	writeBytes(3<<20, []byte(text[:3<<20-4096]))(t, raw)

	for _, ct := range []string{"zlib", "zstd"} {
		for _, cs := range []string{"512", "4096", "65536", "2097152"} {
			t.Run(ct+"-"+cs, func(t *testing.T) {
				img := filepath.Join(t.TempDir(), "c.qcow2")
				testenv.Run(t, "qemu-img", "convert", "-q", "-c", "-f", "raw", "-O", "qcow2", "-o", "compression_type="+ct+",cluster_size="+cs, raw, img)
				checkAcceptedLikeQEMU(t, img)
			})
		}
	}
	t.Run("raw-1000-bytes", func(t *testing.T) {
		odd := filepath.Join(t.TempDir(), "odd.raw")
		if err := os.WriteFile(odd, []byte(strings.Repeat("x", 1000)), 0o644); err != nil {
			t.Fatal(err)
		}
		checkAcceptedLikeQEMU(t, odd)
	})
}

// checkAcceptedLikeQEMU runs inspect and convert --to raw on an image and
// compares with qemu-img's view of it.
func checkAcceptedLikeQEMU(t *testing.T, img string) {
	t.Helper()
	exit, out, stderr := testenv.Exit(t, testenv.Imagectl, "inspect", "-o", "json", img)
	if exit != 0 {
		t.Fatalf("inspect: exit %d\n%s%s", exit, out, stderr)
	}
	var r api.ImageReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	var info struct {
		VirtualSize int64 `json:"virtual-size"`
	}
	if err := json.Unmarshal(testenv.Run(t, "qemu-img", "info", "--output", "json", img), &info); err != nil {
		t.Fatal(err)
	}
	if r.VirtualSize != info.VirtualSize {
		t.Errorf("inspect reports %d bytes, qemu-img info %d", r.VirtualSize, info.VirtualSize)
	}
	ours := filepath.Join(t.TempDir(), "ours.raw")
	if exit, _, stderr := testenv.Exit(t, testenv.Imagectl, "convert", "--to", "raw", img, ours); exit != 0 {
		t.Fatalf("convert: exit %d: %s", exit, stderr)
	}
	theirs := filepath.Join(t.TempDir(), "qemu.raw")
	testenv.Run(t, "qemu-img", "convert", "-q", "-O", "raw", img, theirs)
	a, err := os.ReadFile(ours)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(theirs)
	if err != nil {
		t.Fatal(err)
	}
	if string(a) != string(b) {
		t.Errorf("raw output (%d bytes) differs from qemu-img convert -O raw (%d bytes)", len(a), len(b))
	}
}

// Builders.

// shared is an empty qcow2 image of the given size with one cluster
// written, then edited so that every L1 entry points to the first L2 table
// (sameTable) and every entry of that table to the first data cluster
// (sameCluster).
func shared(size string, sameTable, sameCluster bool) builder {
	return func(t *testing.T, dir string) string {
		p := create(t, dir, "qcow2", size)
		testenv.Run(t, "qemu-io", "-f", "qcow2", "-c", "write -P 0x41 0 64k", p)
		bits := readU32(t, p, offClusterBits)
		cs := uint64(1) << bits
		l1 := l1Entry0(t, p)
		l1Entry := readU64(t, p, l1)
		if sameTable {
			span := cs * cs / 8
			n := (readU64(t, p, offSize) + span - 1) / span
			setN(l1, n, l1Entry)(t, p)
		}
		if sameCluster {
			l2 := l2Entry0(t, p)
			setN(l2, cs/8, readU64(t, p, l2))(t, p)
		}
		return p
	}
}

// setN writes n copies of the big-endian v from off on.
func setN(off int64, n, v uint64) edit {
	b := make([]byte, 8*n)
	for i := range n {
		binary.BigEndian.PutUint64(b[8*i:], v)
	}
	return writeBytes(off, b)
}

// copyL2Entry0 copies the first L2 entry over the next n-1.
func copyL2Entry0(n uint64) edit {
	return func(t *testing.T, path string) {
		l2 := l2Entry0(t, path)
		setN(l2, n, readU64(t, path, l2))(t, path)
	}
}

// dataAtOwnL2Table points guest cluster 0 at the L2 table that maps it.
func dataAtOwnL2Table(t *testing.T, path string) {
	l2 := l2Entry0(t, path)
	setU64(l2, flagCopied|uint64(l2))(t, path)
}

// l2AtL1Table points the L1 entry of guest cluster 0 at the L1 table.
func l2AtL1Table(t *testing.T, path string) {
	l1 := l1Entry0(t, path)
	setU64(l1, flagCopied|uint64(l1))(t, path)
}

// zstdBomb is a 64 KiB-cluster qcow2 (zstd) whose 8192 clusters are each
// the shortest zstd frame for 64 KiB of 0x5a: a single RLE block, 13
// bytes, packed back to back. qemu-io reads it back, so it is a valid image
// by QEMU's standards; only its claim of 1458 guest bytes per byte of file
// is refused.
func zstdBomb(t *testing.T, dir string) string {
	const bits, cs, n = 16, 1 << 16, 8192
	be := binary.BigEndian
	b := make([]byte, 4*cs) // header, L1, refcount table, L2 table
	copy(b, "QFI\xfb")
	be.PutUint32(b[4:], 3)
	be.PutUint32(b[20:], bits)
	be.PutUint64(b[24:], n*cs)
	be.PutUint32(b[36:], 1)
	be.PutUint64(b[40:], cs)
	be.PutUint64(b[48:], 2*cs)
	be.PutUint32(b[56:], 1)
	be.PutUint64(b[72:], 1<<3) // compression type feature
	be.PutUint32(b[96:], 4)
	be.PutUint32(b[100:], 112)
	b[104] = 1 // zstd
	be.PutUint64(b[cs:], flagCopied|3*cs)
	frame := []byte{0x28, 0xb5, 0x2f, 0xfd, 0xa0, 0, 0, 1, 0} // single segment, 64 KiB
	hdr := uint32(cs)<<3 | 1<<1 | 1                           // last RLE block of 64 KiB
	frame = append(frame, byte(hdr), byte(hdr>>8), byte(hdr>>16), 0x5a)
	x := 62 - (bits - 8)
	for i := range uint64(n) {
		host := uint64(len(b))
		b = append(b, frame...)
		sectors := (host+uint64(len(frame))-1)>>9 - host>>9
		be.PutUint64(b[3*cs+8*i:], flagCompressed|sectors<<x|host)
	}
	p := filepath.Join(dir, "bomb.qcow2")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	testenv.Run(t, "qemu-io", "-f", "qcow2", "-c", "read -P 0x5a 0 1M", "-c", "read -P 0x5a 511M 1M", p)
	return p
}
