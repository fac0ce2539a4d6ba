package guest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"strings"
)

// maxAPKInstalled bounds apk's database of installed packages, which
// lists every file: an Alpine desktop's is a few MiB.
const maxAPKInstalled = 16 << 20

// ReadAPK lists the packages apk says are installed
// (/lib/apk/db/installed: a stanza per package, "P:" its name, "V:" its
// version, "A:" its arch, "o:" its origin, the source package).
func ReadAPK(fsys fs.FS) ([]Package, error) {
	b, err := ReadFile(fsys, "/lib/apk/db/installed", maxAPKInstalled)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, ErrNoDatabase
	}
	if err != nil {
		return nil, err
	}
	return parseAPKInstalled(b)
}

// parseAPKInstalled reads the stanzas of apk's installed database.
func parseAPKInstalled(b []byte) ([]Package, error) {
	var out []Package
	p := Package{Type: "apk"}
	flush := func() error {
		if p.Name != "" && p.Version != "" {
			if len(out) == maxPackages {
				return fmt.Errorf("more than %d packages", maxPackages)
			}
			if p.Source == p.Name {
				p.Source = ""
			}
			out = append(out, p)
		}
		p = Package{Type: "apk"}
		return nil
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64<<10), maxDpkgLine)
	for sc.Scan() {
		line := sc.Text()
		if strings.TrimSpace(line) == "" {
			if err := flush(); err != nil {
				return nil, err
			}
			continue
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok || len(k) != 1 {
			continue
		}
		switch k {
		case "P":
			p.Name = v
		case "V":
			p.Version = v
		case "A":
			p.Arch = v
		case "o":
			p.Source = v
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return out, nil
}

// packageReaders are the package databases ListPackages looks for, in
// order, with the manager each names.
var packageReaders = []struct {
	manager string
	read    func(fs.FS) ([]Package, error)
}{{"dpkg", ReadDpkg}, {"rpm", ReadRPM}, {"apk", ReadAPK}}

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
