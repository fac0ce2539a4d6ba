package guest

import (
	"cmp"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync/atomic"

	"www.velocidex.com/golang/go-ntfs/parser"
	"www.velocidex.com/golang/regparser"
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
	// cloudbaseInit: cloudbase-init's configuration is where its
	// installer puts it.
	cloudbaseInit bool
	// version and name are the registry's, when read: "10.0.22631" and
	// "Windows 11 Pro 23H2".
	version, name string
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
	w.cloudbaseInit = exists(cloudbaseInitConf)
	if w.kernel {
		if hive, err := parser.GetDataForPath(ntfs, "Windows/System32/config/SOFTWARE"); err == nil {
			w.version, w.name = windowsVersion(hive)
		}
	}
	if br.left.Load() < 0 {
		return w, fmt.Errorf("ntfs: more than %d bytes read: %w", maxNTFSRead, ErrTooLarge)
	}
	return w, nil
}

// cloudbaseInitConf is cloudbase-init's configuration as its installer
// writes it.
const cloudbaseInitConf = "Program Files/Cloudbase Solutions/Cloudbase-Init/conf/cloudbase-init.conf"

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

// windowsVersion reads Windows' version from its SOFTWARE registry hive
// (HKLM\SOFTWARE\Microsoft\Windows NT\CurrentVersion), with
// Velocidex's regparser: "major.minor.build" and the product name with
// its release ("23H2"). Windows 11 still names itself Windows 10 there;
// its build (22000 and later) tells it apart, as Microsoft documents.
func windowsVersion(hive io.ReaderAt) (version, name string) {
	reg, err := regparser.NewRegistry(hive)
	if err != nil {
		return "", ""
	}
	key := reg.OpenKey(`Microsoft\Windows NT\CurrentVersion`)
	if key == nil {
		return "", ""
	}
	str, num := map[string]string{}, map[string]uint64{}
	for _, v := range key.Values() {
		d := v.ValueData()
		if d == nil {
			continue
		}
		switch n := v.ValueName(); n {
		case "ProductName", "DisplayVersion", "CurrentBuild", "CurrentBuildNumber":
			v := strings.TrimRight(d.String, "\x00") // REG_SZ keeps its terminator
			if len(v) <= 256 && strings.IndexFunc(v, func(r rune) bool { return r < 0x20 || r == 0x7f }) < 0 {
				str[n] = v
			}
		case "CurrentMajorVersionNumber", "CurrentMinorVersionNumber":
			num[n] = d.Uint64
		}
	}
	build := cmp.Or(str["CurrentBuild"], str["CurrentBuildNumber"])
	if major, ok := num["CurrentMajorVersionNumber"]; ok && build != "" {
		version = fmt.Sprintf("%d.%d.%s", major, num["CurrentMinorVersionNumber"], build)
	}
	name = str["ProductName"]
	if b, err := strconv.Atoi(build); err == nil && b >= 22000 && strings.HasPrefix(name, "Windows 10") {
		name = "Windows 11" + strings.TrimPrefix(name, "Windows 10")
	}
	if dv := str["DisplayVersion"]; name != "" && dv != "" {
		name += " " + dv
	}
	return version, name
}
