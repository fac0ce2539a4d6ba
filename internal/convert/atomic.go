package convert

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// OutputFile is an output file written under a temporary name next to its
// path, which it replaces only on Commit: a failed or interrupted write
// never leaves a partial file at path. Write (or WriteAt through File)
// fills it; Write leaves holes where whole 4 KiB blocks are zero, as
// qemu-img does for raw output.
type OutputFile struct {
	// File is the temporary file; it may be read and written directly.
	File *os.File
	path string
	sync bool
	off  int64 // Write's position
	data int64 // bytes Write stored, holes not counted
	used bool  // Write was called
	done bool
}

// CreateOutput creates the temporary file of an output to path. With sync,
// Commit flushes the data to disk before the rename, so that a crash
// cannot leave an empty file at path either. The caller calls Commit or
// Discard.
func CreateOutput(path string, sync bool) (*OutputFile, error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".partial-*")
	if err != nil {
		return nil, err
	}
	return &OutputFile{File: tmp, path: path, sync: sync}, nil
}

// sparseBlock is the granularity of the holes Write leaves.
const sparseBlock = 4096

var zeroBlock = make([]byte, sparseBlock)

// Write appends p to the file, seeking over whole zero blocks instead of
// writing them. The file's size is set by Commit (or Finish).
func (o *OutputFile) Write(p []byte) (int, error) {
	o.used = true
	n := len(p)
	for len(p) > 0 {
		// One run of blocks that are all data, or all zero, aligned to
		// the file's blocks.
		first := min(len(p), sparseBlock-int(o.off%sparseBlock))
		zero := bytes.Equal(p[:first], zeroBlock[:first])
		end := first
		for end < len(p) {
			k := min(len(p)-end, sparseBlock)
			if bytes.Equal(p[end:end+k], zeroBlock[:k]) != zero {
				break
			}
			end += k
		}
		if !zero {
			if _, err := o.File.WriteAt(p[:end], o.off); err != nil {
				return n - len(p), err
			}
			o.data += int64(end)
		}
		o.off += int64(end)
		p = p[end:]
	}
	return n, nil
}

// Stored is how many bytes Write stored: the disk space the data takes,
// the holes it left for zero blocks not counted.
func (o *OutputFile) Stored() int64 { return o.data }

// Finish sets the file's size to what Write wrote, which trailing holes
// did not; call it before reading the file back.
func (o *OutputFile) Finish() error {
	if err := o.File.Truncate(o.off); err != nil {
		return fmt.Errorf("writing %s: %w", o.File.Name(), err)
	}
	return nil
}

// Commit sets the size of a file filled by Write (see Finish), gives it
// the mode of the file it replaces, or else the mode a new file gets under
// the process's umask (0644 under 022), flushes it when asked and renames
// it to its path.
func (o *OutputFile) Commit() error {
	if o.used {
		if err := o.Finish(); err != nil {
			return err
		}
	}
	if err := o.File.Chmod(outputMode(o.path)); err != nil {
		return err
	}
	if o.sync {
		if err := unix.Fdatasync(int(o.File.Fd())); err != nil {
			return fmt.Errorf("syncing %s: %w", o.path, err)
		}
	}
	if err := o.File.Close(); err != nil {
		return err
	}
	if err := os.Rename(o.File.Name(), o.path); err != nil {
		return err
	}
	o.done = true
	return nil
}

// Discard removes the temporary file; after Commit it does nothing.
func (o *OutputFile) Discard() {
	if o.done {
		return
	}
	o.done = true
	o.File.Close()
	os.Remove(o.File.Name())
}

// WriteFileAtomic creates path with what write puts into the temporary
// file it is given (through OutputFile's sparse Write, or WriteAt and
// Image.WriteFile on the *os.File), atomically: path appears only once
// write has succeeded. See CreateOutput for sync.
func WriteFileAtomic(path string, sync bool, write func(*OutputFile) error) error {
	out, err := CreateOutput(path, sync)
	if err != nil {
		return err
	}
	defer out.Discard()
	if err := write(out); err != nil {
		return err
	}
	return out.Commit()
}

// outputMode is the permission of a file written to path: that of the
// regular file there, else 0666 less the umask, as os.Create would give.
func outputMode(path string) os.FileMode {
	if fi, err := os.Stat(path); err == nil && fi.Mode().IsRegular() {
		return fi.Mode().Perm()
	}
	return 0o666 &^ umask()
}

// umask reads the process's umask from /proc/self/status: setting it to
// read it back would change it for the other threads meanwhile. 022 when
// it cannot be read.
func umask() os.FileMode {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0o022
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "Umask:"); ok {
			if m, err := strconv.ParseUint(strings.TrimSpace(v), 8, 32); err == nil {
				return os.FileMode(m) & os.ModePerm
			}
		}
	}
	return 0o022
}
