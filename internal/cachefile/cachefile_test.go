package cachefile

import (
	"os"
	"path/filepath"
	"testing"
)

// TestCacheFilesMustBePrivate: CheckPrivate refuses what others may write
// and symbolic links, and accepts a missing path.
func TestCacheFilesMustBePrivate(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	if err := CheckPrivate(p, false); err != nil {
		t.Errorf("missing file: %v", err)
	}
	os.WriteFile(p, []byte("{}"), 0o600)
	if err := CheckPrivate(p, false); err != nil {
		t.Errorf("private file: %v", err)
	}
	for _, mode := range []os.FileMode{0o620, 0o602, 0o666} {
		os.Chmod(p, mode)
		if err := CheckPrivate(p, false); err == nil {
			t.Errorf("mode %04o accepted", mode)
		}
	}
	link := filepath.Join(dir, "link")
	os.Symlink(p, link)
	if err := CheckPrivate(link, false); err == nil {
		t.Error("symbolic link accepted")
	}
	os.Chmod(p, 0o600)
	if err := CheckPrivate(link, true); err != nil {
		t.Errorf("symbolic link to a private file, followed: %v", err)
	}
}

// TestWriteFile: the file is replaced whole, private, and no temporary
// file stays behind.
func TestWriteFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	for _, data := range []string{`{"a":1}`, `{"b":2}`} {
		if err := WriteFile(path, []byte(data)); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(path)
		if err != nil || string(got) != data {
			t.Fatalf("read %q, %v; want %q", got, err, data)
		}
	}
	if err := CheckFile(dir, path); err != nil {
		t.Errorf("the written file is not private: %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("%d files in the folder, want only the one written", len(entries))
	}
	if err := WriteFile(filepath.Join(dir, "missing", "x"), nil); err == nil {
		t.Error("writing into a missing folder succeeded")
	}
}
