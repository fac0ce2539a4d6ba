package convert

import (
	"io"
	"os"
)

// holeBlock is the granularity at which raw output to a file skips zeros,
// like qemu-img's default -S 4k.
const holeBlock = 4096

// output counts what is written and, for regular files, writes at absolute
// offsets so that zero blocks of raw data become holes.
type output struct {
	w    io.Writer
	file *os.File // nil unless w is a regular file
	n    int64    // bytes of output produced, holes included
}

// newOutput wraps w. A regular *os.File is written from offset 0 and
// truncated to the output size at the end, whatever its current offset.
func newOutput(w io.Writer) *output {
	o := &output{w: w}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode().IsRegular() {
			o.file = f
		}
	}
	return o
}

// write appends b as it is.
func (o *output) write(b []byte) error {
	var err error
	if o.file != nil {
		_, err = o.file.WriteAt(b, o.n)
	} else {
		_, err = o.w.Write(b)
	}
	o.n += int64(len(b))
	return err
}

// writeData appends b, leaving zero blocks as holes when writing a file.
func (o *output) writeData(b []byte) error {
	if o.file == nil {
		return o.write(b)
	}
	base := o.n
	start := -1 // start of the current run of non-zero blocks
	for i := 0; i < len(b); i += holeBlock {
		blk := b[i:min(i+holeBlock, len(b))]
		if !isZero(blk) {
			if start < 0 {
				start = i
			}
			continue
		}
		if start >= 0 {
			if _, err := o.file.WriteAt(b[start:i], base+int64(start)); err != nil {
				return err
			}
			start = -1
		}
	}
	if start >= 0 {
		if _, err := o.file.WriteAt(b[start:], base+int64(start)); err != nil {
			return err
		}
	}
	o.n += int64(len(b))
	return nil
}

// skip appends n zero bytes: a hole in a file, written zeros otherwise.
func (o *output) skip(n int64) error {
	if o.file != nil {
		o.n += n
		return nil
	}
	for n > 0 {
		k := min(n, int64(len(zeros)))
		if err := o.write(zeros[:k]); err != nil {
			return err
		}
		n -= k
	}
	return nil
}

// presize empties a file and sets its final length before writing, as
// qemu-img does: the file is then one hole, so unwritten ranges read as
// zeros, and writes land inside the file instead of extending it, which is
// cheaper for the filesystem.
func (o *output) presize(n int64) error {
	if o.file == nil {
		return nil
	}
	// Empty a file that has contents, but never truncate an empty one to
	// zero: ext4 then flushes the whole file when it is closed.
	if st, err := o.file.Stat(); err != nil || st.Size() > 0 {
		if err := o.file.Truncate(0); err != nil {
			return err
		}
	}
	return o.file.Truncate(n)
}

// finish sets a file's length, so a trailing hole is part of it.
func (o *output) finish() error {
	if o.file != nil {
		return o.file.Truncate(o.n)
	}
	return nil
}
