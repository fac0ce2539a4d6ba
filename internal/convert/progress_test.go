package convert

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// progressLog records Options.Progress calls and checks them as a bar
// needs them: done never shrinks, the total never changes, and the last
// call says done.
type progressLog struct {
	calls       int
	done, total int64
	backwards   bool
	totals      map[int64]bool
}

func (l *progressLog) report(done, total int64) {
	l.calls++
	if done < l.done {
		l.backwards = true
	}
	l.done = done
	l.total = total
	if l.totals == nil {
		l.totals = map[int64]bool{}
	}
	l.totals[total] = true
}

func (l *progressLog) check(t *testing.T, vsize int64) {
	t.Helper()
	if l.calls == 0 {
		t.Fatal("Progress was never called")
	}
	if l.backwards {
		t.Error("done went backwards")
	}
	if len(l.totals) != 1 || l.total != vsize || l.done != vsize {
		t.Errorf("last call %d/%d (totals %v), want %d/%d", l.done, l.total, l.totals, vsize, vsize)
	}
}

// TestProgress: every way of writing a conversion reports the guest disk
// from 0 to its virtual size, including a long run of holes at its end
// that no batch reads.
func TestProgress(t *testing.T) {
	const vsize = 48 << 20
	raw := sparseRaw(vsize, 0, 1<<20, 5<<20+3)
	dir := t.TempDir()
	rawPath := filepath.Join(dir, "in.raw")
	if err := os.WriteFile(rawPath, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	qcow := convertBytes(t, raw, Options{})
	open := func(t *testing.T, b []byte, file bool) *Image {
		t.Helper()
		if !file {
			img, err := Open(bytes.NewReader(b), int64(len(b)), OpenOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return img
		}
		f, err := os.Open(rawPath)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		img, err := Open(f, vsize, OpenOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return img
	}
	for _, tc := range []struct {
		name   string
		in     []byte
		file   bool // the input is an *os.File (copy_file_range path)
		to     Format
		stream bool // Plan and Write to a buffer, not WriteFile
	}{
		{"raw to qcow2 stream", raw, false, FormatQCOW2, true},
		{"raw to raw stream", raw, false, FormatRaw, true},
		{"qcow2 to raw stream", qcow, false, FormatRaw, true},
		{"raw to qcow2 file", raw, false, FormatQCOW2, false},
		{"qcow2 to qcow2 file", qcow, false, FormatQCOW2, false},
		{"raw file to raw file", nil, true, FormatRaw, false},
		{"raw file to qcow2 stream", nil, true, FormatQCOW2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var log progressLog
			img := open(t, tc.in, tc.file)
			opts := Options{To: tc.to, Progress: log.report}
			if tc.stream {
				p, err := img.Plan(t.Context(), opts)
				if err != nil {
					t.Fatal(err)
				}
				if log.calls != 0 {
					t.Errorf("Plan's scan reported progress %d times", log.calls)
				}
				if err := p.Write(t.Context(), &bytes.Buffer{}); err != nil {
					t.Fatal(err)
				}
			} else {
				f, err := os.Create(filepath.Join(t.TempDir(), "out"))
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				if _, err := img.WriteFile(t.Context(), f, opts); err != nil {
					t.Fatal(err)
				}
			}
			log.check(t, vsize)
		})
	}
}
