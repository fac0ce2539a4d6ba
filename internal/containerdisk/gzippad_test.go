package containerdisk

import (
	"bytes"
	stdgzip "compress/gzip"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os/exec"
	"testing"

	kgzip "github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"github.com/klauspost/pgzip"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/imagepipe/imagepipe/internal/reject"

	"github.com/imagepipe/imagepipe/internal/need"
)

// smallDisks are disks whose layers compress to a few hundred bytes or
// less: nothing at all, one byte, and the zeros of an empty 1 GiB qcow2
// image (qemu-img create: 196624 bytes, nearly all zeros).
func smallDisks() map[string][]byte {
	emptyQCOW2 := make([]byte, 196624)
	copy(emptyQCOW2, "QFI\xfb\x00\x00\x00\x03")
	return map[string][]byte{"nothing": nil, "one byte": {7}, "empty qcow2": emptyQCOW2, "4 MiB of zeros": make([]byte, 4<<20)}
}

// buildLayer builds the layer of disk and returns it with its tar.
func buildLayer(t *testing.T, disk []byte, comp Compression) (LayerInfo, []byte, []byte) {
	t.Helper()
	var out, tee bytes.Buffer
	info, err := WriteLayer(t.Context(), &out, bytesPayload(disk), comp, &tee)
	if err != nil {
		t.Fatal(err)
	}
	if info.Size != int64(out.Len()) || info.Digest != fmt.Sprintf("sha256:%x", sha256.Sum256(out.Bytes())) ||
		info.DiffID != fmt.Sprintf("sha256:%x", sha256.Sum256(tee.Bytes())) {
		t.Fatalf("%s: info %+v does not describe the %d-byte layer and its tar", comp, info, out.Len())
	}
	return info, out.Bytes(), tee.Bytes()
}

// unpaddedGzipLayer is the gzip layer as imagectl wrote it before small
// layers were padded: the build's gzip back end straight over the tar.
func unpaddedGzipLayer(t *testing.T, disk []byte) []byte {
	t.Helper()
	var out bytes.Buffer
	zw, err := newGzipWriter(&out)
	if err != nil {
		t.Fatal(err)
	}
	if err := writeDiskTar(t.Context(), zw, bytesPayload(disk)); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// gzipReaders are the gzip decoders layers meet: the standard library
// (crane, skopeo, containerd without unpigz, CDI up to v1.65), klauspost's
// (imagepipe's own checks) and pgzip (CDI v1.66, containers/storage). All
// read concatenated members.
var gzipReaders = map[string]func(io.Reader) (io.Reader, error){
	"compress/gzip": func(r io.Reader) (io.Reader, error) { return stdgzip.NewReader(r) },
	"klauspost":     func(r io.Reader) (io.Reader, error) { return kgzip.NewReader(r) },
	"pgzip":         func(r io.Reader) (io.Reader, error) { return pgzip.NewReader(r) },
}

func decode(newReader func(io.Reader) (io.Reader, error), layer []byte) ([]byte, error) {
	zr, err := newReader(bytes.NewReader(layer))
	if err != nil {
		return nil, err
	}
	return io.ReadAll(zr)
}

// TestNoLayerIsShorterThanCDIsPeek: whatever the disk and compression, the
// layer has at least the 512 bytes CDI's importer reads before it knows
// the format, and every reader decodes it to exactly the tar.
func TestNoLayerIsShorterThanCDIsPeek(t *testing.T) {
	for name, disk := range smallDisks() {
		for _, comp := range []Compression{CompressionGzip, CompressionZstd, CompressionNone} {
			t.Run(name+"/"+string(comp), func(t *testing.T) {
				_, layer, tarball := buildLayer(t, disk, comp)
				if len(layer) < cdiPeekSize {
					t.Errorf("the layer is %d bytes, under CDI's %d-byte peek", len(layer), cdiPeekSize)
				}
				switch comp {
				case CompressionGzip:
					for rname, newReader := range gzipReaders {
						if got, err := decode(newReader, layer); err != nil || !bytes.Equal(got, tarball) {
							t.Errorf("%s: %d bytes, %v; want the %d-byte tar", rname, len(got), err, len(tarball))
						}
					}
				case CompressionZstd:
					dec, err := zstd.NewReader(bytes.NewReader(layer))
					if err != nil {
						t.Fatal(err)
					}
					defer dec.Close()
					if got, err := io.ReadAll(dec); err != nil || !bytes.Equal(got, tarball) {
						t.Errorf("zstd: %d bytes, %v; want the %d-byte tar", len(got), err, len(tarball))
					}
				case CompressionNone:
					if !bytes.Equal(layer, tarball) {
						t.Error("an uncompressed layer is not its tar")
					}
				}
			})
		}
	}
}

// TestSmallGzipLayerIsPaddedInItsHeader: a gzip layer the compressor makes
// shorter than 512 bytes gets a 512-byte header (FEXTRA) and is otherwise
// the compressor's output; the same disk always gives the same bytes.
func TestSmallGzipLayerIsPaddedInItsHeader(t *testing.T) {
	for name, disk := range smallDisks() {
		t.Run(name, func(t *testing.T) {
			before := unpaddedGzipLayer(t, disk)
			info, layer, _ := buildLayer(t, disk, CompressionGzip)
			if len(before) >= cdiPeekSize {
				if !bytes.Equal(layer, before) {
					t.Errorf("a %d-byte layer changed", len(before))
				}
				return
			}
			if layer[3] != gzipFlagExtra || binary.LittleEndian.Uint16(layer[10:]) != gzipPaddedHeaderSize-12 || string(layer[12:14]) != "IP" {
				t.Fatalf("header % x; want FEXTRA with the IP subfield", layer[:16])
			}
			if want := before[gzipFixedHeaderSize:]; !bytes.Equal(layer[gzipPaddedHeaderSize:], want) {
				t.Errorf("the compressed data after the padded header differs from the compressor's")
			}
			if len(layer) != len(before)+gzipPaddedHeaderSize-gzipFixedHeaderSize {
				t.Errorf("%d bytes; want %d", len(layer), len(before)+gzipPaddedHeaderSize-gzipFixedHeaderSize)
			}
			again, _, _ := buildLayer(t, disk, CompressionGzip)
			if again.Digest != info.Digest {
				t.Errorf("digests %s then %s: not deterministic", info.Digest, again.Digest)
			}
			zr, err := stdgzip.NewReader(bytes.NewReader(layer))
			if err != nil {
				t.Fatal(err)
			}
			if len(zr.Extra) != gzipPaddedHeaderSize-12 || zr.Name != "" || zr.Comment != "" {
				t.Errorf("header as read: %d extra bytes, name %q, comment %q", len(zr.Extra), zr.Name, zr.Comment)
			}
		})
	}
}

// TestGzipLayersAtTheThresholdAreUnchanged builds layers just under and
// just over 512 bytes (incompressible disks of growing size): from 512
// bytes on, the layer is exactly what the compressor wrote before padding
// existed; below, it is padded.
func TestGzipLayersAtTheThresholdAreUnchanged(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	random := make([]byte, 600)
	for i := range random {
		random[i] = byte(rng.Uint32())
	}
	var padded, kept int
	for n := 250; n <= len(random); n++ {
		before := unpaddedGzipLayer(t, random[:n])
		_, layer, _ := buildLayer(t, random[:n], CompressionGzip)
		switch {
		case len(before) >= cdiPeekSize && len(before) < cdiPeekSize+20:
			kept++
			if !bytes.Equal(layer, before) {
				t.Errorf("%d-byte disk: the %d-byte layer changed", n, len(before))
			}
		case len(before) < cdiPeekSize:
			padded++
			if len(layer) < cdiPeekSize || layer[3] != gzipFlagExtra {
				t.Errorf("%d-byte disk: a %d-byte layer became %d bytes, flags %#x", n, len(before), len(layer), layer[3])
			}
		}
	}
	if padded == 0 || kept == 0 {
		t.Fatalf("%d layers under 512 bytes and %d just over: the range misses the threshold", padded, kept)
	}
}

// TestLargeLayersAreUnchanged compares the layers of a disk of a few MiB
// with their digests from before small gzip layers were padded, for each
// gzip back end, so that no image's digest changes.
func TestLargeLayersAreUnchanged(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	disk := make([]byte, 3<<20+777)
	for i := range disk {
		if i%5 == 0 || (i > 1<<20 && i < 1<<20+300000) {
			disk[i] = byte(rng.Uint32())
		} else {
			disk[i] = byte(i / 1000)
		}
	}
	const diffID = "sha256:a326388d4afff37434285578adf31c0111b2e4db79b463b26efeb2116072b6bc"
	want := map[Compression]string{
		CompressionZstd: "sha256:9be6e502660cecf9bfa77bce34df3bd706a13067b67171f304c17b412360042c",
		CompressionNone: diffID,
	}
	switch GzipImplementation {
	case "isa-l":
		want[CompressionGzip] = "sha256:081087a86ddfe5b77a4bc47fdbb43b357d316451247b4a2d41514d0ed0739af4"
	case "pgzip":
		want[CompressionGzip] = "sha256:8f8beba587bcfad6194bf9e9abbf811fee4e271f08cf70a501bb0b9d17c0e696"
	default:
		t.Fatalf("no recorded digest for the gzip back end %q", GzipImplementation)
	}
	for comp, digest := range want {
		info, _, _ := buildLayer(t, disk, comp)
		if info.Digest != digest || info.DiffID != diffID {
			t.Errorf("%s (%s): digest %s, diff ID %s; want %s, %s", comp, GzipImplementation, info.Digest, info.DiffID, digest, diffID)
		}
	}
}

// trickleReader returns at most one byte a call, like a reader that
// buffers nothing.
type trickleReader struct{ r io.Reader }

func (t trickleReader) Read(p []byte) (int, error) { return t.r.Read(p[:min(len(p), 1)]) }

// readGzipLikeCDI reads a gzip layer as CDI's importer up to v1.66 does
// (pkg/importer/format-readers.go, constructReaders): the first 512 bytes
// into a buffer, a gzip reader over that buffer and the rest, the first
// 512 decompressed bytes into the same buffer, then the rest through one
// more MultiReader. With trickle, the gzip reader gets the peeked bytes
// one at a time, so that any it has not consumed when the buffer is
// overwritten come out wrong (kubevirt/containerized-data-importer#4277).
func readGzipLikeCDI(layer []byte, newReader func(io.Reader) (io.Reader, error), trickle bool) ([]byte, error) {
	stream := bytes.NewReader(layer)
	buf := make([]byte, 512)
	if _, err := io.ReadFull(stream, buf); err != nil {
		return nil, fmt.Errorf("could not process image header: %w", err)
	}
	if buf[0] != 0x1f || buf[1] != 0x8b {
		return nil, errors.New("not gzip")
	}
	var top io.Reader = io.MultiReader(bytes.NewReader(buf), stream)
	if trickle {
		top = trickleReader{top}
	}
	zr, err := newReader(top)
	if err != nil {
		return nil, err
	}
	if _, err := io.ReadFull(zr, buf); err != nil {
		return nil, err
	}
	return io.ReadAll(io.MultiReader(bytes.NewReader(buf), zr))
}

// TestGzipLayerSurvivesCDIsHeaderProbe: CDI's reading gives the tar for
// every layer, and a padded one survives even a gzip reader that takes the
// peeked bytes one by one: they are all header, consumed before the buffer
// is overwritten. An unpadded small layer is what CDI could not read.
func TestGzipLayerSurvivesCDIsHeaderProbe(t *testing.T) {
	for name, disk := range smallDisks() {
		t.Run(name, func(t *testing.T) {
			_, layer, tarball := buildLayer(t, disk, CompressionGzip)
			isPadded := layer[3]&gzipFlagExtra != 0
			for rname, newReader := range gzipReaders {
				for _, trickle := range []bool{false, true} {
					if trickle && !isPadded {
						continue
					}
					got, err := readGzipLikeCDI(layer, newReader, trickle)
					if err != nil || !bytes.Equal(got, tarball) {
						t.Errorf("%s, trickle %v: %d bytes, %v; want the %d-byte tar", rname, trickle, len(got), err, len(tarball))
					}
				}
			}
			if before := unpaddedGzipLayer(t, disk); len(before) < cdiPeekSize {
				if _, err := readGzipLikeCDI(before, gzipReaders["compress/gzip"], false); !errors.Is(err, io.ErrUnexpectedEOF) {
					t.Errorf("the unpadded %d-byte layer: %v; want unexpected EOF, as CDI fails", len(before), err)
				}
			}
		})
	}
}

// TestPaddedGzipLayerReadByTheGzipTool decodes a padded layer with GNU
// gzip, an independent reader.
func TestPaddedGzipLayerReadByTheGzipTool(t *testing.T) {
	need.Program(t, "gzip")
	_, layer, tarball := buildLayer(t, smallDisks()["empty qcow2"], CompressionGzip)
	cmd := exec.Command("gzip", "-d", "-c")
	cmd.Stdin = bytes.NewReader(layer)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	got, err := cmd.Output()
	if err != nil || !bytes.Equal(got, tarball) || stderr.Len() > 0 {
		t.Fatalf("gzip -d: %d bytes, %v %s; want the %d-byte tar", len(got), err, stderr.String(), len(tarball))
	}
}

// TestOpenLayerReadsPaddedAndHostileHeaders: OpenLayer accepts a padded
// layer, and a tenant's gzip header with the largest FEXTRA (64 KiB, the
// most its 16-bit length can say) in every member costs nothing more than
// that; garbage behind a valid header is still rejected.
func TestOpenLayerReadsPaddedAndHostileHeaders(t *testing.T) {
	_, layer, tarball := buildLayer(t, smallDisks()["empty qcow2"], CompressionGzip)
	lr, err := OpenLayer(ocispec.MediaTypeImageLayerGzip, bytes.NewReader(layer))
	if err != nil {
		t.Fatalf("a padded layer: %v", err)
	}
	diffID, err := lr.CopyDisk(t.Context(), io.Discard)
	lr.Close()
	if want := fmt.Sprintf("sha256:%x", sha256.Sum256(tarball)); err != nil || diffID != want {
		t.Errorf("a padded layer: diff ID %s, %v; want %s", diffID, err, want)
	}

	// Two members, each with a 65535-byte FEXTRA, the tar split between them.
	hugeExtra := func(part []byte) []byte {
		var b bytes.Buffer
		zw := stdgzip.NewWriter(&b)
		zw.Extra = bytes.Repeat([]byte{0xff}, 65535)
		zw.Write(part)
		zw.Close()
		return b.Bytes()
	}
	hostile := append(hugeExtra(tarball[:700]), hugeExtra(tarball[700:])...)
	lr, err = OpenLayer(ocispec.MediaTypeImageLayerGzip, bytes.NewReader(hostile))
	if err != nil {
		t.Fatalf("a layer with 64 KiB FEXTRA fields: %v", err)
	}
	if _, err := lr.CopyDisk(t.Context(), io.Discard); err != nil {
		t.Errorf("a layer with 64 KiB FEXTRA fields: %v", err)
	}
	lr.Close()

	// A valid padded header, then garbage; and a truncated FEXTRA.
	garbage := append(append([]byte(nil), layer[:gzipPaddedHeaderSize]...), bytes.Repeat([]byte{0xff}, 4096)...)
	truncated := append(append([]byte(nil), layer[:10]...), 0xff, 0xff, 1, 2, 3)
	for name, blob := range map[string][]byte{"garbage after the header": garbage, "truncated FEXTRA": truncated} {
		lr, err := OpenLayer(ocispec.MediaTypeImageLayerGzip, bytes.NewReader(blob))
		if err == nil {
			_, err = lr.CopyDisk(t.Context(), io.Discard)
			lr.Close()
		}
		if re := reject.As(err); re == nil || re.Reason != reject.InvalidLayer {
			t.Errorf("%s: %v; want an %s rejection", name, err, reject.InvalidLayer)
		}
	}
}

// TestPadGzipHeaderRefusesOptionalFields: the padding only rewrites a
// header it fully understands.
func TestPadGzipHeaderRefusesOptionalFields(t *testing.T) {
	var b bytes.Buffer
	zw := stdgzip.NewWriter(&b)
	zw.Name = "disk.tar"
	zw.Close()
	if _, err := padGzipHeader(b.Bytes()); !errors.Is(err, errGzipHeader) {
		t.Errorf("a header with FNAME: %v; want errGzipHeader", err)
	}
	if _, err := padGzipHeader([]byte{0x1f, 0x8b}); !errors.Is(err, errGzipHeader) {
		t.Errorf("two bytes: %v; want errGzipHeader", err)
	}
}
