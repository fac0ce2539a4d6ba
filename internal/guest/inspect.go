package guest

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"slices"
	"strings"

	"github.com/imagepipe/imagepipe/pkg/api"
)

// noOSNote starts the note on a disk with no operating system found.
const noOSNote = "no operating system found"

// maxFilesystems bounds the filesystems Inspect opens to look for the
// operating system, maxPhysicalVolumes the LVM2 physical volumes whose
// logical volumes it looks into.
const (
	maxFilesystems     = 8
	maxPhysicalVolumes = 4
)

// Bounds of the report, which a verdict carries: the partitions listed,
// the notes and each note's length. Their sum keeps a report under about
// 10 KiB.
const (
	maxReportPartitions = 32
	maxNotes            = 16
	maxNoteLength       = 300
)

// Inspect reads what the guest disk r of size bytes holds: its layout, the
// firmware it can boot with and its EFI loaders, and, from the first
// ext2/3/4 or XFS filesystem holding an os-release, the operating system,
// the installed packages (dpkg's, rpm's or apk's), the kernels and their
// virtio drivers, cloud-init, qemu-guest-agent and a serial console;
// without one, Windows and its virtio drivers (detectWindows). It
// never fails: what it cannot read is a note. Its work is the sum of the
// readers' bounds, for at most maxFilesystems filesystems.
func Inspect(r io.ReaderAt, size int64) *api.GuestReport {
	rep, _ := InspectPackages(r, size)
	return rep
}

// InspectPackages is Inspect, and also returns the installed packages the
// report counts (at most maxPackages), from which BOM writes the guest's
// SBOM: the report, which a verdict carries, stays small, and the list
// goes where the caller keeps it.
func InspectPackages(r io.ReaderAt, size int64) (*api.GuestReport, []Package) {
	rep := &api.GuestReport{}
	l, err := Probe(r, size)
	if err != nil {
		rep.PartitionTable = "unknown"
		rep.Notes = append(rep.Notes, "the partition table could not be read: "+err.Error())
		return rep, nil
	}
	rep.PartitionTable, rep.Filesystem = l.Table, l.Filesystem
	rep.Notes = append(rep.Notes, l.Notes...)
	for _, p := range l.Partitions {
		rep.Partitions = append(rep.Partitions, p.GuestPartition)
	}
	rep.Firmware = BootOf(l)
	for _, ld := range Loaders(r, l) {
		rep.Firmware.Loaders = append(rep.Firmware.Loaders, ld.Path)
		if ld.Signed && !rep.Firmware.SecureBoot {
			rep.Firmware.SecureBoot = true
			rep.Firmware.Reasons = append(rep.Firmware.Reasons, "a signed EFI loader at "+ld.Path)
		}
		if rep.Architecture == "" {
			rep.Architecture = ld.Arch
		}
	}
	pkgs, notes := readRoot(r, size, l, rep)
	rep.Notes = append(rep.Notes, notes...)
	if rep.OS == nil {
		notes := detectWindows(r, l, rep)
		if rep.OS != nil { // the Windows note says why there is no os-release
			rep.Notes = slices.DeleteFunc(rep.Notes, func(n string) bool { return strings.HasPrefix(n, noOSNote) })
		}
		rep.Notes = append(rep.Notes, notes...)
	}
	bound(rep)
	return rep, pkgs
}

// bound keeps rep within the report's bounds, saying what it left out.
func bound(rep *api.GuestReport) {
	if n := len(rep.Partitions); n > maxReportPartitions {
		rep.Partitions = rep.Partitions[:maxReportPartitions]
		rep.Notes = append(rep.Notes, fmt.Sprintf("%d more partitions not listed", n-maxReportPartitions))
	}
	if n := len(rep.Notes); n > maxNotes {
		rep.Notes = append(rep.Notes[:maxNotes-1], fmt.Sprintf("%d more notes", n-maxNotes+1))
	}
	for i, n := range rep.Notes {
		if len(n) > maxNoteLength {
			rep.Notes[i] = strings.ToValidUTF8(n[:maxNoteLength], "") + "…"
		}
	}
}

// fsCandidate is a filesystem Inspect may read the system from: on a
// partition (0: the whole disk), or in a logical volume lv there.
type fsCandidate struct {
	partition  int
	lv         string
	r          io.ReaderAt
	off, size  int64
	filesystem string
}

// where names the candidate in notes.
func (c fsCandidate) where() string {
	w := fmt.Sprintf("partition %d", c.partition)
	if c.partition == 0 {
		w = "the whole disk"
	}
	if c.lv != "" {
		w += " (logical volume " + c.lv + ")"
	}
	return w
}

// lvmCandidates are the filesystems (at most limit) in the linear
// logical volumes of the LVM2 physical volume at [off, off+size) of r,
// with notes on what was not read.
func lvmCandidates(r io.ReaderAt, partition int, off, size int64, limit int) ([]fsCandidate, []string) {
	where := fsCandidate{partition: partition}.where()
	lvs, notes, err := ReadLVM(r, off, size)
	for i := range notes {
		notes[i] = where + ": " + notes[i]
	}
	if err != nil {
		return nil, append(notes, fmt.Sprintf("%s: %v", where, err))
	}
	var out []fsCandidate
	for i, lv := range lvs {
		if len(out) >= limit {
			notes = append(notes, fmt.Sprintf("%s: %d more logical volumes not read (at most %d filesystems are)", where, len(lvs)-i, maxFilesystems))
			break
		}
		fs, err := probeFilesystem(lv, 0, lv.Size)
		if err != nil {
			notes = append(notes, fmt.Sprintf("%s: logical volume %s not read: %v", where, lv.Name, err))
			continue
		}
		if fs != "" && fs != FsSwap && fs != FsLVMPV {
			out = append(out, fsCandidate{partition, lv.Name, lv, 0, lv.Size, fs})
		}
	}
	return out, notes
}

// readRoot fills rep.OS, rep.Packages and the system facts from the
// first readable filesystem with an os-release, and returns its packages
// and notes on what it could not read.
func readRoot(r io.ReaderAt, size int64, l *Layout, rep *api.GuestReport) ([]Package, []string) {
	var cands []fsCandidate
	var notes []string
	pvs := 0
	add := func(partition int, off, size int64, filesystem string) {
		switch filesystem {
		case "", FsSwap, FsFAT, FsNTFS: // NTFS: Windows, which detectWindows reads
		case FsLVMPV:
			if pvs++; pvs > maxPhysicalVolumes {
				notes = append(notes, fmt.Sprintf("%s: an LVM2 physical volume not read (at most %d are)", fsCandidate{partition: partition}.where(), maxPhysicalVolumes))
				return
			}
			lvs, n := lvmCandidates(r, partition, off, size, maxFilesystems-len(cands))
			cands, notes = append(cands, lvs...), append(notes, n...)
		default:
			cands = append(cands, fsCandidate{partition, "", r, off, size, filesystem})
		}
	}
	if l.Table == TableNone {
		add(0, 0, size, l.Filesystem)
	}
	for _, p := range l.Partitions {
		add(p.Number, p.Start, p.Size, p.Filesystem)
	}
	for i, c := range cands {
		where := c.where()
		if i == maxFilesystems {
			notes = append(notes, fmt.Sprintf("%d more filesystems not read (at most %d are)", len(cands)-i, maxFilesystems))
			break
		}
		fsys, err := OpenFS(c.r, c.off, c.size, c.filesystem)
		if err != nil {
			notes = append(notes, fmt.Sprintf("%s (%s) not read: %v", where, c.filesystem, err))
			continue
		}
		osr, err := ReadOSRelease(fsys)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			notes = append(notes, fmt.Sprintf("%s: os-release not read: %v", where, err))
			continue
		}
		osr.Partition, osr.LogicalVolume = c.partition, c.lv
		rep.OS = osr
		manager, pkgs, err := ListPackages(fsys)
		switch {
		case err == nil:
			rep.Packages = &api.GuestPackages{Manager: manager, Count: len(pkgs)}
		case !errors.Is(err, ErrNoDatabase):
			notes = append(notes, fmt.Sprintf("%s: packages not read: %v", where, err))
		}
		for _, n := range readSystem(fsys, rep) {
			notes = append(notes, where+": "+n)
		}
		return pkgs, notes
	}
	if rep.OS == nil {
		notes = append(notes, noOSNote+" (no os-release on a filesystem imagepipe reads: ext2/3/4, XFS, also in LVM2 linear volumes)")
	}
	return nil, notes
}
