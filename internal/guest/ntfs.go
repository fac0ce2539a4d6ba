package guest

import (
	"fmt"
	"io"
	"sync/atomic"

	"www.velocidex.com/golang/go-ntfs/parser"
)

// Limits of the NTFS reading; docs/security.md lists them.
const (
	// maxNTFSRead bounds the bytes read from one NTFS volume: its boot
	// sector, the MFT records and directory index blocks of a few paths.
	maxNTFSRead = 64 << 20
	// ntfsPages is go-ntfs's page cache: 64 pages of 4 KiB.
	ntfsPages = 64
)

// windowsDrivers are the virtio-win drivers of KubeVirt's virtio
// devices: its disk (viostor, or vioscsi behind a SCSI controller) and
// its network interface.
var windowsDrivers = []string{"viostor", "vioscsi", "netkvm"}

// windowsSystem is what an NTFS volume says of the Windows on it: whether
// its kernel is there, and which virtio drivers are installed beside it.
type windowsSystem struct {
	kernel bool
	virtio []string
}

// readWindows looks in the NTFS volume at [off, off+size) of r, with
// Velocidex's go-ntfs, for Windows' kernel (\Windows\System32\
// ntoskrnl.exe) and the virtio drivers in \Windows\System32\drivers,
// within maxNTFSRead bytes; a panic of the library is an error.
func readWindows(r io.ReaderAt, off, size int64) (w windowsSystem, err error) {
	defer recoverAsError(&err)
	br := &budgetReader{r: io.NewSectionReader(r, off, size)}
	br.left.Store(maxNTFSRead)
	pr, err := parser.NewPagedReader(br, 4096, ntfsPages)
	if err != nil {
		return w, err
	}
	ntfs, err := parser.GetNTFSContext(pr, 0)
	if err != nil {
		return w, fmt.Errorf("ntfs: %w", err)
	}
	exists := func(path string) bool {
		_, err := parser.GetDataForPath(ntfs, path)
		return err == nil
	}
	w.kernel = exists("Windows/System32/ntoskrnl.exe")
	for _, d := range windowsDrivers {
		if exists("Windows/System32/drivers/" + d + ".sys") {
			w.virtio = append(w.virtio, d)
		}
	}
	if br.left.Load() < 0 {
		return w, fmt.Errorf("ntfs: more than %d bytes read: %w", maxNTFSRead, ErrTooLarge)
	}
	return w, nil
}

// budgetReader fails every read once left bytes have been read.
type budgetReader struct {
	r    io.ReaderAt
	left atomic.Int64
}

func (b *budgetReader) ReadAt(p []byte, off int64) (int, error) {
	if b.left.Add(-int64(len(p))) < 0 {
		return 0, fmt.Errorf("ntfs: more than %d bytes read: %w", maxNTFSRead, ErrTooLarge)
	}
	return b.r.ReadAt(p, off)
}
