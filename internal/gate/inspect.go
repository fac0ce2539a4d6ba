package gate

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime/debug"
	"slices"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/imagepipe/imagepipe/internal/convert"
	"github.com/imagepipe/imagepipe/internal/guest"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// Inspector reads the guest of a verified disk in a process of its own,
// so that nothing in a guest, whatever a reader makes of it (a crash no
// recover catches, memory, time), can cost the verification its verdict:
// a guest that cannot be read is a note. The process is Path with Args,
// and the flags InspectArgs names; it is given the disk as file 3 and
// prints the report (InspectOne).
type Inspector struct {
	Path string
	Args []string
	// MemoryLimit bounds the process's data (RLIMIT_DATA, which the Go
	// runtime's heap counts against); 0 means DefaultInspectMemory.
	MemoryLimit int64
	// CPULimit bounds its CPU time (RLIMIT_CPU); 0 means
	// DefaultInspectCPU.
	CPULimit time.Duration
}

const (
	// DefaultInspectMemory is an inspection's data bound: its readers'
	// bounds (docs/security.md) need less than a third of it.
	DefaultInspectMemory = 256 << 20
	// DefaultInspectCPU is an inspection's CPU bound: a real guest takes
	// well under a second.
	DefaultInspectCPU = time.Minute
	// maxInspected bounds what the process prints: the report and the
	// package list, which the store keeps only within maxPackagesRecord.
	maxInspected = maxPackagesRecord + 1<<20
)

// inspect reads the guest of the disk in f (size bytes, verified as
// Open opens it with opts), in the Inspector's process when there is one:
// its report and its installed packages.
func (v *Verifier) inspect(ctx context.Context, f *os.File, size int64, opts convert.OpenOptions) (*api.GuestReport, []guest.Package) {
	if v.Inspector == nil {
		found, err := InspectOne(ctx, f, size, opts.MaxVirtualSize, string(opts.Format))
		if err != nil {
			return unread(err.Error()), nil
		}
		return found.Report, found.Packages
	}
	return v.Inspector.run(ctx, f, size, opts)
}

// Inspected is what InspectOne found, as the Inspector's process prints
// it.
type Inspected struct {
	Report   *api.GuestReport `json:"report"`
	Packages []guest.Package  `json:"packages,omitempty"`
}

func (in *Inspector) run(ctx context.Context, f *os.File, size int64, opts convert.OpenOptions) (*api.GuestReport, []guest.Package) {
	mem, cpu := in.MemoryLimit, in.CPULimit
	if mem <= 0 {
		mem = DefaultInspectMemory
	}
	if cpu <= 0 {
		cpu = DefaultInspectCPU
	}
	cmd := exec.CommandContext(ctx, in.Path, append(slices.Clone(in.Args),
		"--disk-size", strconv.FormatInt(size, 10),
		"--max-virtual-size", strconv.FormatInt(opts.MaxVirtualSize, 10),
		"--format", string(opts.Format),
		"--memory-limit", strconv.FormatInt(mem, 10),
		"--cpu-limit", cpu.String())...)
	tail := &tailBuffer{max: 4096}
	cmd.Stderr = tail
	cmd.ExtraFiles = []*os.File{f}
	cmd.WaitDelay = time.Second
	out, err := cmd.StdoutPipe()
	if err == nil {
		err = startTied(cmd)
	}
	if err != nil {
		return unread("starting its process: " + err.Error()), nil
	}
	// Decoded as it comes, within its bound: the package list is the
	// large part, and is not held twice.
	var found Inspected
	decodeErr := json.NewDecoder(io.LimitReader(out, maxInspected)).Decode(&found)
	_, _ = io.Copy(io.Discard, out)
	if err := cmd.Wait(); err != nil {
		if ctx.Err() != nil {
			return unread(ctx.Err().Error()), nil
		}
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() && (ws.Signal() == syscall.SIGKILL || ws.Signal() == syscall.SIGXCPU) {
			return unread(fmt.Sprintf("its process used its CPU time limit of %s", cpu)), nil
		}
		return unread(fmt.Sprintf("its process ended (%v): %s", err, tail.crashLine())), nil
	}
	if decodeErr != nil || found.Report == nil {
		return unread(fmt.Sprintf("its report could not be read (%v)", decodeErr)), nil
	}
	return found.Report, found.Packages
}

// unread is the report of a guest that could not be read.
func unread(why string) *api.GuestReport {
	return &api.GuestReport{PartitionTable: "unknown", Notes: []string{"the guest was not read: " + why}}
}

// InspectOne reads the guest of the disk in f, of size bytes, opened as
// the verification opened it (its virtual size bound and its format, ""
// when detected): what the Inspector's process does once it bounded
// itself (LimitInspection).
func InspectOne(ctx context.Context, f io.ReaderAt, size, maxVirtualSize int64, format string) (*Inspected, error) {
	img, err := convert.Open(f, size, convert.OpenOptions{MaxVirtualSize: maxVirtualSize, Format: convert.Format(format)})
	if err != nil {
		return nil, err
	}
	g, err := img.Guest(ctx)
	if err != nil {
		return nil, err
	}
	rep, pkgs := guest.InspectPackages(g, img.Info().VirtualSize)
	if n := packagesJSONBound(pkgs); n > maxPackagesRecord {
		// Not printed, so that the report gets through within its bound.
		rep.Notes = append(rep.Notes, fmt.Sprintf("the package list is not kept: it may take %d bytes, over the bound of %d", n, maxPackagesRecord))
		pkgs = nil
	}
	return &Inspected{Report: rep, Packages: pkgs}, nil
}

// LimitInspection sets the calling process's own bounds for InspectOne:
// its data (RLIMIT_DATA, with the Go runtime's soft limit below it) and
// its CPU time (RLIMIT_CPU; the kernel kills it there).
func LimitInspection(memory int64, cpu time.Duration) error {
	debug.SetMemoryLimit(memory / 2)
	if err := unix.Setrlimit(unix.RLIMIT_DATA, &unix.Rlimit{Cur: uint64(memory), Max: uint64(memory)}); err != nil {
		return fmt.Errorf("limiting the inspection's memory: %w", err)
	}
	secs := uint64(max(cpu.Seconds(), 1))
	if err := unix.Setrlimit(unix.RLIMIT_CPU, &unix.Rlimit{Cur: secs, Max: secs}); err != nil {
		return fmt.Errorf("limiting the inspection's CPU time: %w", err)
	}
	_ = os.WriteFile("/proc/self/oom_score_adj", []byte("1000"), 0)
	return nil
}
