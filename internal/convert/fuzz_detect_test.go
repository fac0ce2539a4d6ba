package convert

import (
	"bytes"
	"slices"
	"testing"

	"github.com/imagepipe/imagepipe/internal/reject"
)

// FuzzDetect checks the raw-confusion invariant: content that matches any
// signature of a format other than ISO is never opened as raw, whether the
// caller detects or declares raw, and detection is deterministic.
func FuzzDetect(f *testing.F) {
	for _, s := range signatures {
		b := make([]byte, 4096)
		off := s.offset
		if off < 0 {
			off += int64(len(b))
		}
		if off+int64(len(s.magic)) <= int64(len(b)) {
			copy(b[off:], s.magic)
			f.Add(b)
		}
	}
	// ISO 9660 is raw to every reader, unlike the formats above: alone it
	// opens (AllowISO), beside another format's signature it must not.
	iso := make([]byte, 36<<10)
	copy(iso[0x8001:], "CD001")
	f.Add(iso)
	polyglot := bytes.Clone(iso)
	copy(polyglot[len(polyglot)-512:], "conectix")
	f.Add(polyglot)
	f.Add(make([]byte, 1024))
	f.Add([]byte("createType=\"monolithicFlat\""))
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 64<<10 {
			return
		}
		r := bytes.NewReader(b)
		d, err := Detect(r, int64(len(b)))
		if err != nil {
			t.Fatalf("Detect on a bytes.Reader: %v", err)
		}
		again, _ := Detect(r, int64(len(b)))
		if again.Format != d.Format || !slices.Equal(again.Matches, d.Matches) {
			t.Fatalf("Detect is not deterministic: %+v then %+v", d, again)
		}
		other := slices.ContainsFunc(d.Matches, func(f Format) bool { return f != FormatISO })
		opts := OpenOptions{MaxVirtualSize: 1 << 20, AllowISO: true}
		for _, declared := range []Format{"", FormatRaw} {
			opts.Format = declared
			img, err := Open(r, int64(len(b)), opts)
			if err == nil && other && img.Info().Format == FormatRaw {
				t.Fatalf("content matching %v opened as raw (declared %q)", d.Matches, declared)
			}
			if err != nil && reject.As(err) == nil {
				t.Fatalf("Open: %v is not a rejection", err)
			}
		}
	})
}
