package convert

import (
	"bytes"
	"testing"

	"github.com/imagepipe/imagepipe/internal/reject"
)

// image builds content with magic strings placed at offsets.
func image(size int, parts map[int]string) []byte {
	b := make([]byte, size)
	for off, s := range parts {
		if off < 0 {
			off += size
		}
		copy(b[off:], s)
	}
	return b
}

func TestDetect(t *testing.T) {
	qcow2v3 := "QFI\xfb\x00\x00\x00\x03"
	tests := []struct {
		name     string
		content  []byte
		declared Format
		allowISO bool
		want     Format
		reason   reject.Reason // "" = accepted
	}{
		{"raw zeros", make([]byte, 4096), "", false, FormatRaw, ""},
		{"raw with MBR", image(4096, map[int]string{510: "\x55\xaa"}), "", false, FormatRaw, ""},
		{"qcow2", image(4096, map[int]string{0: qcow2v3}), "", false, FormatQCOW2, ""},
		{"qcow v1", image(4096, map[int]string{0: "QFI\xfb\x00\x00\x00\x01"}), "", false, FormatQCOW1, reject.UnsupportedFormat},
		{"qed", image(4096, map[int]string{0: "QED\x00"}), "", false, FormatQED, reject.UnsupportedFormat},
		{"vhdx", image(4096, map[int]string{0: "vhdxfile"}), "", false, FormatVHDX, reject.UnsupportedFormat},
		{"vhd dynamic", image(4096, map[int]string{0: "conectix"}), "", false, FormatVHD, reject.UnsupportedFormat},
		{"vhd fixed footer", image(4096, map[int]string{-512: "conectix"}), "", false, FormatVHD, reject.UnsupportedFormat},
		{"vdi", image(4096, map[int]string{0x40: "\x7f\x10\xda\xbe"}), "", false, FormatVDI, reject.UnsupportedFormat},
		{"vmdk sparse", image(4096, map[int]string{0: "KDMV", 512: `RW 2048 SPARSE "self.vmdk"`}), "", false, FormatVMDK, reject.UnsupportedFormat},
		{"vmdk descriptor naming a host file", []byte("# Disk DescriptorFile\nversion=1\ncreateType=\"monolithicFlat\"\nRW 2048 FLAT \"/etc/shadow\" 0\n"), "", false, FormatVMDK, reject.ExternalReference},
		{"vmdk descriptor without the first line", []byte("# made by hand\ncreateType=\"vmfs\"\n"), "", false, FormatVMDK, reject.UnsupportedFormat},
		{"luks", image(4096, map[int]string{0: "LUKS\xba\xbe"}), "", false, FormatLUKS, reject.Encrypted},
		{"iso refused", image(0x9000, map[int]string{0x8001: "CD001"}), "", false, FormatISO, reject.UnsupportedFormat},
		{"iso as raw on request", image(0x9000, map[int]string{0x8001: "CD001"}), "", true, FormatISO, ""},
		{"iso declared raw without allow", image(0x9000, map[int]string{0x8001: "CD001"}), FormatRaw, false, FormatISO, reject.FormatMismatch},
		{"polyglot iso+qcow2", image(0x9000, map[int]string{0: qcow2v3, 0x8001: "CD001"}), "", true, FormatRaw, reject.Polyglot},
		{"polyglot qcow2+vhd footer", image(4096, map[int]string{0: qcow2v3, -512: "conectix"}), "", false, FormatRaw, reject.Polyglot},
		{"declared raw, qcow2 content", image(4096, map[int]string{0: qcow2v3}), FormatRaw, false, FormatQCOW2, reject.FormatMismatch},
		{"declared qcow2, raw content", make([]byte, 4096), FormatQCOW2, false, FormatRaw, reject.FormatMismatch},
		{"declared qcow2, qcow2 content", image(4096, map[int]string{0: qcow2v3}), FormatQCOW2, false, FormatQCOW2, ""},
		{"short file", []byte("QF"), "", false, FormatRaw, ""},
		{"parallels", image(4096, map[int]string{0: "WithoutFreeSpace"}), "", false, FormatParallels, reject.UnsupportedFormat},
		{"parallels ext", image(4096, map[int]string{0: "WithouFreSpacExt"}), "", false, FormatParallels, reject.UnsupportedFormat},
		{"bochs", image(4096, map[int]string{0: "Bochs Virtual HD Image"}), "", false, FormatBochs, reject.UnsupportedFormat},
		{"cloop", image(4096, map[int]string{0: "#!/bin/sh\n#V2.0 Format\nmodprobe cloop file=$0 && mount"}), "", false, FormatCloop, reject.UnsupportedFormat},
		{"dmg trailer", image(4096, map[int]string{-512: "koly"}), "", false, FormatDMG, reject.UnsupportedFormat},
		{"declared raw, parallels content", image(4096, map[int]string{0: "WithoutFreeSpace"}), FormatRaw, false, FormatParallels, reject.FormatMismatch},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := Detect(bytes.NewReader(tt.content), int64(len(tt.content)))
			if err != nil {
				t.Fatal(err)
			}
			if d.Format != tt.want {
				t.Errorf("Format = %s, want %s (matches %v)", d.Format, tt.want, d.Matches)
			}
			err = d.Check(tt.declared, tt.allowISO)
			got := reject.Reason("")
			if re := reject.As(err); re != nil {
				got = re.Reason
			} else if err != nil {
				t.Fatalf("non-rejection error %v", err)
			}
			if got != tt.reason {
				t.Errorf("verdict %q (%v), want %q", got, err, tt.reason)
			}
		})
	}
}

func TestDetectWrapper(t *testing.T) {
	tests := map[string]Wrapper{
		"\x1f\x8b\x08\x00":     WrapperGzip,
		"\x28\xb5\x2f\xfd\x00": WrapperZstd,
		"\xfd7zXZ\x00\x00":     WrapperXZ,
		"BZh91AY":              WrapperBzip2,
		"QFI\xfb":              WrapperNone,
		"":                     WrapperNone,
	}
	for head, want := range tests {
		if got := DetectWrapper([]byte(head)); got != want {
			t.Errorf("DetectWrapper(%q) = %q, want %q", head, got, want)
		}
	}
}
