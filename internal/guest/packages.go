package guest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"strings"
)

// packageReaders are the package databases ListPackages looks for, in
// order, with the manager each names.
var packageReaders = []struct {
	manager string
	read    func(fs.FS) ([]Package, error)
}{{"dpkg", ReadDpkg}, {"rpm", ReadRPM}, {"apk", ReadAPK}}

// readDatabase reads a package database kept in one file, of at most
// limit bytes, with parse; ErrNoDatabase when the root has no such file.
func readDatabase(fsys fs.FS, name string, limit int64, parse func([]byte) ([]Package, error)) ([]Package, error) {
	b, err := ReadFile(fsys, name, limit)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, ErrNoDatabase
	}
	if err != nil {
		return nil, err
	}
	return parse(b)
}

// scanStanzas reads a database of stanzas, as dpkg and apk keep theirs:
// "key:value" lines, a blank line after each package. line is given each
// other line (at most maxDpkgLine bytes), end is called at each blank
// line and at the end.
func scanStanzas(b []byte, line func(string), end func() error) error {
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64<<10), maxDpkgLine)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == "" {
			if err := end(); err != nil {
				return err
			}
			continue
		}
		line(sc.Text())
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return end()
}

// addPackage appends p to out when it has a name and a version, its
// source dropped when it names the package itself; past maxPackages it
// is an error.
func addPackage(out []Package, p Package) ([]Package, error) {
	if p.Name == "" || p.Version == "" {
		return out, nil
	}
	if len(out) == maxPackages {
		return out, fmt.Errorf("more than %d packages", maxPackages)
	}
	if p.Source == p.Name {
		p.Source = ""
	}
	return append(out, p), nil
}

// ListPackages lists the installed packages of the first package
// database the root holds (dpkg's, rpm's or apk's) and names its
// manager; ErrNoDatabase when it holds none of them.
func ListPackages(fsys fs.FS) (manager string, pkgs []Package, err error) {
	for _, r := range packageReaders {
		pkgs, err := r.read(fsys)
		if errors.Is(err, ErrNoDatabase) {
			continue
		}
		if err != nil {
			return r.manager, nil, fmt.Errorf("%s's database: %w", r.manager, err)
		}
		return r.manager, pkgs, nil
	}
	return "", nil, ErrNoDatabase
}
