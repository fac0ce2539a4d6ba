package convert

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/imagepipe/imagepipe/internal/reject"
)

// Format names a disk image format, as detected from content.
type Format string

// Formats imagepipe recognises. Only FormatRaw and FormatQCOW2 are accepted
// (and FormatISO as raw when OpenOptions.AllowISO is set); the others are
// recognised so they can be rejected with a precise message.
const (
	FormatRaw   Format = "raw"
	FormatQCOW2 Format = "qcow2"
	FormatQCOW1 Format = "qcow"
	FormatVMDK  Format = "vmdk"
	FormatVHD   Format = "vhd"
	FormatVHDX  Format = "vhdx"
	FormatVDI   Format = "vdi"
	FormatQED   Format = "qed"
	FormatLUKS  Format = "luks"
	FormatISO   Format = "iso"
	// Formats QEMU reads but never writes; recognised so that a file of
	// theirs is never taken for a raw disk.
	FormatParallels Format = "parallels"
	FormatBochs     Format = "bochs"
	FormatCloop     Format = "cloop"
	FormatDMG       Format = "dmg"
)

// ProbeSize is how many leading bytes detection looks at. Detection also
// reads the last 512 bytes (a fixed VHD keeps its footer there) and the ISO
// 9660 volume descriptors at 32 KiB.
const ProbeSize = 64 << 10

// signature is one content rule: magic bytes at an offset.
type signature struct {
	format Format
	offset int64 // negative: from the end of the file
	magic  string
}

// signatures lists every magic we test. A file matching rules of two
// different formats is a polyglot and is rejected.
//
// The list covers every format QEMU's block layer recognises by content
// (the probe functions of its qcow, qcow2, qed, vdi, vmdk, vpc, vhdx,
// parallels, bochs, cloop and luks drivers), so nothing QEMU would open as
// another format is ever accepted as raw. It is stricter than QEMU in two
// places, on purpose: a VHD footer in the last sector (QEMU probes only
// offset 0, but other readers honour the footer) and an Apple disk image's
// "koly" trailer (QEMU picks its dmg driver by file name alone, which a
// consumer may do too). A raw disk that starts with a boot sector, a
// partition table or a filesystem matches none of these.
var signatures = []signature{
	{FormatQCOW2, 0, "QFI\xfb"}, // version decides qcow2 vs qcow v1
	{FormatQED, 0, "QED\x00"},
	{FormatVHDX, 0, "vhdxfile"},
	{FormatVHD, 0, "conectix"},    // dynamic/differencing: footer copy at 0
	{FormatVHD, -512, "conectix"}, // fixed: footer in the last sector
	{FormatVDI, 0x40, "\x7f\x10\xda\xbe"},
	{FormatVMDK, 0, "KDMV"}, // hosted sparse extent
	{FormatVMDK, 0, "COWD"}, // ESX sparse extent
	{FormatVMDK, 0, "# Disk DescriptorFile"},
	{FormatVMDK, 0, "# Disk Descriptor File"},
	{FormatLUKS, 0, "LUKS\xba\xbe"},
	{FormatLUKS, 0, "SKUL\xba\xbe"}, // LUKS2 secondary header
	{FormatParallels, 0, "WithoutFreeSpace"},
	{FormatParallels, 0, "WithouFreSpacExt"},
	{FormatBochs, 0, "Bochs Virtual HD Image"},
	{FormatCloop, 0, "#!/bin/sh\n#V2.0 Format\nmodprobe cloop file=$0"},
	{FormatDMG, -512, "koly"},
	{FormatISO, 0x8001, "CD001"},
	{FormatISO, 0x8801, "CD001"},
	{FormatISO, 0x9001, "CD001"},
}

// Detection is what the content says an image is.
type Detection struct {
	// Format is the single format the content matches, FormatRaw when none.
	Format Format
	// Matches lists every format whose signature matched; more than one
	// means a polyglot.
	Matches []Format
	// References lists the files a VMDK descriptor names as its extents.
	References []string
}

// Detect identifies the format of the image in r (size bytes) from its
// content only. It never returns an error for a well-formed read; callers
// decide with Check what is acceptable.
func Detect(r io.ReaderAt, size int64) (Detection, error) {
	var found []Format
	for _, s := range signatures {
		off := s.offset
		if off < 0 {
			off = size + off
		}
		if off < 0 || off+int64(len(s.magic)) > size {
			continue
		}
		buf := make([]byte, len(s.magic))
		if _, err := r.ReadAt(buf, off); err != nil && !errors.Is(err, io.EOF) {
			return Detection{}, fmt.Errorf("reading signature at %d: %w", off, err)
		}
		if string(buf) != s.magic {
			continue
		}
		f := s.format
		if f == FormatQCOW2 {
			var v [4]byte
			if _, err := r.ReadAt(v[:], 4); err == nil && binary.BigEndian.Uint32(v[:]) == 1 {
				f = FormatQCOW1
			}
		}
		if !slices.Contains(found, f) {
			found = append(found, f)
		}
	}
	// A VMDK descriptor may start with comments other than the usual first
	// line; its createType key is mandatory, so look for that too.
	if !slices.Contains(found, FormatVMDK) {
		head := make([]byte, min(size, 4096))
		if _, err := r.ReadAt(head, 0); err != nil && !errors.Is(err, io.EOF) {
			return Detection{}, fmt.Errorf("reading the first sector: %w", err)
		}
		if bytes.Contains(head, []byte("createType=")) {
			found = append(found, FormatVMDK)
		}
	}
	d := Detection{Format: FormatRaw, Matches: found}
	if len(found) == 1 {
		d.Format = found[0]
	}
	if d.Format == FormatVMDK {
		refs, err := vmdkExtentFiles(r, size)
		if err != nil {
			return Detection{}, err
		}
		d.References = refs
	}
	return d, nil
}

// vmdkExtentFiles returns the file names a VMDK text descriptor's extent
// lines (`RW 2048 FLAT "name" 0`) point at. Opening them is how a crafted
// descriptor reads host files; they are reported, never opened.
func vmdkExtentFiles(r io.ReaderAt, size int64) ([]string, error) {
	head := make([]byte, min(size, 16<<10))
	n, err := r.ReadAt(head, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("reading the VMDK descriptor: %w", err)
	}
	if bytes.HasPrefix(head, []byte("KDMV")) || bytes.HasPrefix(head, []byte("COWD")) {
		return nil, nil // a sparse extent's embedded descriptor names itself
	}
	var files []string
	for _, line := range strings.Split(string(head[:n]), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 4 || !slices.Contains([]string{"RW", "RDONLY", "NOACCESS"}, fields[0]) {
			continue
		}
		if q := strings.SplitN(line, "\"", 3); len(q) == 3 {
			files = append(files, q[1])
		}
	}
	return files, nil
}

// Check turns a detection into a verdict: nil when an image of that content
// may be opened as declared (declared == "" means "whatever it is"), else a
// *reject.Error.
func (d Detection) Check(declared Format, allowISO bool) error {
	if len(d.Matches) > 1 {
		names := make([]string, len(d.Matches))
		for i, f := range d.Matches {
			names[i] = string(f)
		}
		return reject.New(reject.Polyglot, "the content matches several formats at once (%s); such files are a known attack on format detection", strings.Join(names, ", "))
	}
	if len(d.References) > 0 {
		return reject.New(reject.ExternalReference, "the VMDK descriptor points at other files (%s); only self-contained qcow2 or raw images are accepted", strings.Join(d.References, ", "))
	}
	got := d.Format
	if got == FormatISO && allowISO {
		got = FormatRaw
	}
	if declared != "" && declared != got && !(declared == FormatISO && d.Format == FormatISO) {
		return reject.New(reject.FormatMismatch, "the image was declared %s but its content is %s", declared, d.Format)
	}
	switch got {
	case FormatRaw, FormatQCOW2:
		return nil
	case FormatLUKS:
		return reject.New(reject.Encrypted, "the image is a LUKS encrypted container; upload the decrypted disk")
	case FormatISO:
		return reject.New(reject.UnsupportedFormat, "the image is an ISO 9660 filesystem; ask for it to be accepted as raw explicitly")
	case FormatQCOW1:
		return reject.New(reject.UnsupportedFormat, "qcow version 1 images are not supported; convert to qcow2 first")
	default:
		return reject.New(reject.UnsupportedFormat, "%s images are not supported; convert to qcow2 or raw first", got)
	}
}

// Wrapper names a compression wrapper around a whole image file.
type Wrapper string

// Wrappers recognised by Unwrap. WrapperBzip2 is recognised only to be
// rejected with a clear message.
const (
	WrapperNone  Wrapper = ""
	WrapperGzip  Wrapper = "gzip"
	WrapperZstd  Wrapper = "zstd"
	WrapperXZ    Wrapper = "xz"
	WrapperBzip2 Wrapper = "bzip2"
)

var wrapperMagics = []struct {
	w     Wrapper
	magic []byte
}{
	{WrapperGzip, []byte{0x1f, 0x8b}},
	{WrapperZstd, []byte{0x28, 0xb5, 0x2f, 0xfd}},
	{WrapperXZ, []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}},
	{WrapperBzip2, []byte("BZh")},
}

// DetectWrapper reports which compression wrapper, if any, starts with head.
func DetectWrapper(head []byte) Wrapper {
	for _, m := range wrapperMagics {
		if bytes.HasPrefix(head, m.magic) {
			return m.w
		}
	}
	return WrapperNone
}
