package convert

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestWriteFileAtomic: the file appears whole or not at all, and Write
// leaves holes where whole blocks are zero, trailing ones included.
func TestWriteFileAtomic(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "disk.raw")
	data := make([]byte, 1<<20)
	copy(data[5000:], "imagepipe")
	if err := WriteFileAtomic(path, true, func(f *OutputFile) error {
		for off := 0; off < len(data); off += 7777 { // writes across block edges
			if _, err := f.Write(data[off:min(off+7777, len(data))]); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read %d bytes, %v; want the %d written", len(got), err, len(data))
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if blocks := st.Sys().(*syscall.Stat_t).Blocks; blocks*512 > 64<<10 {
		t.Errorf("%d bytes allocated for one block of data: not sparse", blocks*512)
	}
	if st.Mode().Perm() != 0o644 {
		t.Errorf("mode %04o, want 0644", st.Mode().Perm())
	}

	failed := filepath.Join(dir, "failed.raw")
	boom := errors.New("boom")
	if err := WriteFileAtomic(failed, false, func(f *OutputFile) error {
		f.Write(data)
		return boom
	}); !errors.Is(err, boom) {
		t.Fatalf("failing write: %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("%d files after a failed write, want only the first output", len(entries))
	}
}
