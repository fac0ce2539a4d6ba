//go:build unix

package gate

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestOpenWorkDirRemovesOnlyDeadGatesFolders: a starting gate removes the
// folder of a gate that is gone (its lock is free) with what it holds,
// keeps a running gate's (locked) and anything that is not a gate's
// folder, and makes a locked folder of its own, removed by Close.
func TestOpenWorkDirRemovesOnlyDeadGatesFolders(t *testing.T) {
	tmp := t.TempDir()
	live, err := OpenWorkDir(tmp, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	dead := filepath.Join(tmp, workDirPrefix+"dead")
	spool := filepath.Join(dead, "verify-1", "imagepipe-gate.disk")
	if err := os.MkdirAll(filepath.Dir(spool), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(spool, []byte("a dead gate's spool"), 0o600); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(tmp, "verify-other")
	if err := os.Mkdir(other, 0o700); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(tmp, workDirPrefix+"link")
	if err := os.Symlink(other, link); err != nil {
		t.Fatal(err)
	}

	w, err := OpenWorkDir(tmp, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dead); !os.IsNotExist(err) {
		t.Errorf("the dead gate's folder is still there (%v)", err)
	}
	for _, kept := range []string{live.Path, other, link} {
		if _, err := os.Lstat(kept); err != nil {
			t.Errorf("%s was removed: %v", kept, err)
		}
	}
	// The new folder is locked: a third gate keeps it.
	if removed, err := removeDeadWorkDirs(tmp); err != nil || len(removed) != 0 {
		t.Errorf("a third gate removed %v (%v); every gate folder left is a running gate's", removed, err)
	}
	names, err := filepath.Glob(filepath.Join(tmp, workDirPrefix+"*"))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{link, live.Path, w.Path}; !slices.Equal(sorted(names), sorted(want)) {
		t.Errorf("gate folders %v; want %v", names, want)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(w.Path); !os.IsNotExist(err) {
		t.Errorf("Close left %s (%v)", w.Path, err)
	}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}
