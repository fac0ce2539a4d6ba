package gate

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/validate"
	"github.com/klauspost/compress/zstd"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/imagepipe/imagepipe/internal/containerdisk"
	"github.com/imagepipe/imagepipe/pkg/api"
	"github.com/imagepipe/imagepipe/test/oddlayer"
)

// TestCanonicalLayerIsImagepipes pushes a disk imagepipe's writer made
// (one the gate verifies as it streams) in each layer oddlayer builds:
// tars with PAX records, GNU long names and links, owner names and
// padding, gzip streams with every header field, more members or bytes
// after them, zstd streams with skippable or several frames. Each is
// refused for its reason, or accepted with a canonical image whose layer
// holds exactly imagepipe's tar, the diff ID its config names, and is
// either the layer the gate's own writer makes or, only where the pushed
// layer's tar and compression framing are imagepipe's, the pushed layer.
// Every canonical image with a gzip layer passes go-containerregistry's
// validate.Image (what `crane validate` runs).
func TestCanonicalLayerIsImagepipes(t *testing.T) {
	e := newEnv(t)
	disk := qcow2Of(t, rawDisk(t, 4<<20, 34))
	cases, err := oddlayer.Cases(t.Context(), disk)
	if err != nil {
		t.Fatal(err)
	}
	canonicalTar := oddlayer.CanonicalTar(disk)
	written := map[containerdisk.Compression][]byte{}
	for _, comp := range []containerdisk.Compression{containerdisk.CompressionGzip, containerdisk.CompressionZstd, containerdisk.CompressionNone} {
		var b bytes.Buffer
		if _, err := containerdisk.WriteLayer(t.Context(), &b, payload(disk), comp, nil); err != nil {
			t.Fatal(err)
		}
		written[comp] = b.Bytes()
	}
	for i, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			repo := fmt.Sprintf("acme/odd-%02d", i)
			pushed := (&crafted{layer: c.Layer, layerMediaType: c.MediaType, diffID: c.DiffID,
				config: ocispec.Image{Platform: ocispec.Platform{OS: "linux", Architecture: "amd64"}}}).push(t, e, repo)
			v := e.verify(t, repo, pushed)
			if c.Reject != "" {
				if v.Verdict != api.VerdictRejected || len(v.Reasons) != 1 || v.Reasons[0].Code != string(c.Reject) || v.Reasons[0].Message == "" {
					t.Fatalf("%+v; want rejected for %s", v, c.Reject)
				}
				return
			}
			if v.Verdict != api.VerdictAccepted || len(v.Images) != 1 {
				t.Fatalf("%+v; want accepted", v)
			}
			layer := checkCanonical(t, e, repo, v.Images[0].Canonical, canonicalTar)
			switch {
			case c.Kept && !bytes.Equal(layer, c.Layer):
				t.Errorf("the canonical layer is not the pushed one, whose tar and framing are imagepipe's")
			case !c.Kept && !bytes.Equal(layer, written[c.Compression()]):
				t.Errorf("the canonical layer (%d bytes) is not the %d bytes imagepipe's writer makes of the disk; pushed: %v", len(layer), len(written[c.Compression()]), bytes.Equal(layer, c.Layer))
			}
		})
	}
}

// TestOtherToolsZstdLayerIsRewritten: a raw disk (an MBR, zeros, some
// data) in a zstd layer made by klauspost's default encoder, as skopeo
// and containerd make zstd layers, is accepted, whether its tar is
// imagepipe's or another tool's. The encoder's first block holds the tar
// headers, the MBR and zeros in far fewer than 512 bytes, and CDI's
// importer up to v1.66 misreads a stream whose first block ends before
// byte 512; the gate keeps no layer in another framing than imagepipe's,
// so the canonical layer is the one imagepipe's writer makes of the disk,
// and the canonical image verifies to itself.
func TestOtherToolsZstdLayerIsRewritten(t *testing.T) {
	e := newEnv(t)
	disk := make([]byte, 4<<20)
	entry := disk[446:462] // the MBR's first partition: Linux, from sector 2048 to the end
	entry[4] = 0x83
	binary.LittleEndian.PutUint32(entry[8:], 2048)
	binary.LittleEndian.PutUint32(entry[12:], uint32(len(disk)/512-2048))
	disk[510], disk[511] = 0x55, 0xaa
	rng := rand.New(rand.NewPCG(36, 7))
	for i := 1 << 20; i < 1<<20+256<<10; i++ {
		disk[i] = byte(rng.Uint32())
	}
	var written bytes.Buffer
	if _, err := containerdisk.WriteLayer(t.Context(), &written, payload(disk), containerdisk.CompressionZstd, nil); err != nil {
		t.Fatal(err)
	}
	canonicalTar := oddlayer.CanonicalTar(disk)
	for i, tarball := range [][]byte{canonicalTar, foreignTar(disk)} {
		var layer bytes.Buffer
		enc, err := zstd.NewWriter(&layer)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := enc.Write(tarball); err != nil {
			t.Fatal(err)
		}
		if err := enc.Close(); err != nil {
			t.Fatal(err)
		}
		if end := zstdFirstBlockEnd(t, layer.Bytes()); end >= 512 {
			t.Fatalf("tar %d: the encoder's first block ends at byte %d; the case needs one that ends before byte 512", i, end)
		}
		repo := fmt.Sprintf("acme/zstd-%d", i)
		pushed := (&crafted{layer: layer.Bytes(), layerMediaType: ocispec.MediaTypeImageLayerZstd, diffID: digest.FromBytes(tarball).String(),
			config: ocispec.Image{Platform: ocispec.Platform{OS: "linux", Architecture: "amd64"}}}).push(t, e, repo)
		v := e.verify(t, repo, pushed)
		if v.Verdict != api.VerdictAccepted || len(v.Images) != 1 || v.Images[0].Format != "raw" {
			t.Fatalf("tar %d: %+v; want accepted as a raw disk", i, v)
		}
		canonical := v.Images[0].Canonical
		if canonical == pushed {
			t.Fatalf("tar %d: the pushed image is its own canonical image", i)
		}
		got := checkCanonical(t, e, repo, canonical, canonicalTar)
		if !bytes.Equal(got, written.Bytes()) {
			t.Errorf("tar %d: the canonical layer (%d bytes) is not the %d bytes imagepipe's writer makes of the disk; pushed: %v", i, len(got), written.Len(), bytes.Equal(got, layer.Bytes()))
		}
		lr, err := containerdisk.OpenLayer(ocispec.MediaTypeImageLayerZstd, bytes.NewReader(got))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := lr.CopyDisk(t.Context(), io.Discard); err != nil || !lr.OwnCompressionFraming() {
			t.Errorf("tar %d: the canonical layer's framing is not imagepipe's (%v)", i, err)
		}
		lr.Close()
		if again := e.verify(t, repo, canonical); again.Verdict != api.VerdictAccepted || again.Images[0].Canonical != canonical {
			t.Errorf("tar %d: the canonical image does not verify to itself: %+v", i, again)
		}
	}
}

// zstdFirstBlockEnd is the offset at which the first block of the zstd
// stream b ends: its frame header, block header and block content (RFC
// 8878, sections 3.1.1.1 and 3.1.1.2).
func zstdFirstBlockEnd(t *testing.T, b []byte) int {
	t.Helper()
	if len(b) < 5 || binary.LittleEndian.Uint32(b) != 0xFD2FB528 {
		t.Fatalf("not a zstd frame: % x", b[:min(len(b), 8)])
	}
	fhd := b[4]
	single := fhd&0x20 != 0
	n := 5 + [4]int{0, 1, 2, 4}[fhd&3] // magic, descriptor, dictionary ID
	if !single {
		n++ // window descriptor
	}
	switch fcs := fhd >> 6; {
	case fcs == 0 && single:
		n++
	case fcs > 0:
		n += 1 << fcs
	}
	if len(b) < n+3 {
		t.Fatalf("the zstd frame ends in its header")
	}
	h := uint32(b[n]) | uint32(b[n+1])<<8 | uint32(b[n+2])<<16
	size := int(h >> 3)
	if h>>1&3 == 1 { // run-length: one byte
		size = 1
	}
	return n + 3 + size
}

// checkCanonical reads the canonical image repo@canonical and checks that
// its layer decompresses to wantTar, whose sha256 is the diff ID its
// config names, and that go-containerregistry validates it where it can
// read the layer (gzip). It returns the layer.
func checkCanonical(t *testing.T, e *env, repo, canonical string, wantTar []byte) []byte {
	t.Helper()
	ref := mustDigest(t, e.host+"/"+repo+"@"+canonical)
	img, err := remote.Image(ref, remote.WithContext(t.Context()))
	if err != nil {
		t.Fatal(err)
	}
	m, err := img.Manifest()
	if err != nil || len(m.Layers) != 1 {
		t.Fatalf("the canonical manifest: %v, %+v", err, m)
	}
	cfg, err := img.ConfigFile()
	if err != nil || len(cfg.RootFS.DiffIDs) != 1 {
		t.Fatalf("the canonical config: %v, %+v", err, cfg)
	}
	rc, err := e.reg.OpenBlob(t.Context(), ref.Context(), m.Layers[0].Digest.String())
	if err != nil {
		t.Fatal(err)
	}
	layer, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || digest.FromBytes(layer).String() != m.Layers[0].Digest.String() || int64(len(layer)) != m.Layers[0].Size {
		t.Fatalf("the canonical layer: %d bytes (%v); the manifest says %s, %d bytes", len(layer), err, m.Layers[0].Digest, m.Layers[0].Size)
	}
	got, err := oddlayer.Tar(string(m.Layers[0].MediaType), layer)
	if err != nil {
		t.Fatalf("decompressing the canonical layer: %v", err)
	}
	if d := digest.FromBytes(got).String(); d != cfg.RootFS.DiffIDs[0].String() {
		t.Errorf("the canonical layer's tar is %s; its config names %s", d, cfg.RootFS.DiffIDs[0])
	}
	if !bytes.Equal(got, wantTar) {
		t.Errorf("the canonical layer's tar (%d bytes) is not imagepipe's tar of the disk (%d bytes)", len(got), len(wantTar))
	}
	if m.Layers[0].MediaType == ocispec.MediaTypeImageLayerGzip {
		if err := validate.Image(img); err != nil {
			t.Errorf("validate.Image: %v", err)
		}
	}
	return layer
}

// TestForeignLayerStartIsReadOnce: a layer whose first bytes show it is
// not imagepipe's (a PAX record before the disk, a gzip header with a file
// name, a zstd stream without the lead frame) has its disk spooled as it
// is read, so the gate reads it once, not once to check it as it streams
// and again to spool it.
func TestForeignLayerStartIsReadOnce(t *testing.T) {
	e := newEnv(t)
	reg := &countingRegistry{Registry: e.reg}
	e.v.Registry = reg
	disk := qcow2Of(t, rawDisk(t, 4<<20, 35))
	cases, err := oddlayer.Cases(t.Context(), disk)
	if err != nil {
		t.Fatal(err)
	}
	readOnce := map[string]bool{"tar: PAX mtime, atime and ctime records": true, "tar: foreign owner names": true, "stream: gzip with FNAME": true, "stream: one zstd frame": true}
	for i, c := range cases {
		if !readOnce[c.Name] {
			continue
		}
		delete(readOnce, c.Name)
		repo := fmt.Sprintf("acme/once-%02d", i)
		pushed := (&crafted{layer: c.Layer, layerMediaType: c.MediaType, diffID: c.DiffID,
			config: ocispec.Image{Platform: ocispec.Platform{OS: "linux", Architecture: "amd64"}}}).push(t, e, repo)
		if v := e.verify(t, repo, pushed); v.Verdict != api.VerdictAccepted {
			t.Fatalf("%s: %+v", c.Name, v)
		}
		if n := reg.opened(digest.FromBytes(c.Layer).String()); n != 1 {
			t.Errorf("%s: the layer was read %d times; want once", c.Name, n)
		}
	}
	if len(readOnce) > 0 {
		t.Fatalf("no such cases: %v", readOnce)
	}
}
