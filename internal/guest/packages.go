package guest

import (
	"errors"
	"fmt"
	"io/fs"
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
