package gate

import (
	"bytes"
	"crypto/sha256"
	"io"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

// floor is what any verifier of a layer must spend at least, measured on
// the pushed layer held in memory: decompressing it (one stream, the
// fastest Go decoders), and decompressing it while hashing the blob (its
// digest) and the tar (the config's diff ID) on the same core.
type floor struct {
	decodeSecs float64 // decompression alone
	cpuSecs    float64 // decompression and both hashes, one core
}

// measureFloor reads ref's layer into memory and times the two floors.
func measureFloor(t testing.TB, ref string) floor {
	t.Helper()
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(r, remote.WithContext(t.Context()))
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("the bench image has %d layers (%v)", len(layers), err)
	}
	mt, err := layers[0].MediaType()
	if err != nil {
		t.Fatal(err)
	}
	rc, err := layers[0].Compressed()
	if err != nil {
		t.Fatal(err)
	}
	blob, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	decode := func(hashAll bool) float64 {
		start := time.Now()
		var in io.Reader = bytes.NewReader(blob)
		blobSum := sha256.New()
		if hashAll {
			in = io.TeeReader(in, blobSum)
		}
		var dec io.Reader
		if string(mt) == "application/vnd.oci.image.layer.v1.tar+zstd" {
			zr, err := zstd.NewReader(in, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(128<<20))
			if err != nil {
				t.Fatal(err)
			}
			defer zr.Close()
			dec = zr
		} else {
			zr, err := gzip.NewReader(in)
			if err != nil {
				t.Fatal(err)
			}
			dec = zr
		}
		var out io.Writer = io.Discard
		if hashAll {
			out = sha256.New()
		}
		if _, err := io.CopyBuffer(out, dec, make([]byte, 1<<20)); err != nil {
			t.Fatal(err)
		}
		return time.Since(start).Seconds()
	}
	return floor{decodeSecs: decode(false), cpuSecs: decode(true)}
}
