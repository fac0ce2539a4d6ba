package guest

import (
	"errors"
	"io/fs"
	"strings"
)

// Limits of the package database readers; docs/security.md lists them.
const (
	// maxDpkgStatus bounds /var/lib/dpkg/status: a desktop with 5,000
	// packages has about 8 MiB; the gate's verification child, which
	// reads it, has 128 MiB in all.
	maxDpkgStatus = 16 << 20
	// maxPackages bounds the packages one guest lists.
	maxPackages = 100000
	// maxDpkgLine bounds one line of the status file.
	maxDpkgLine = 1 << 20
)

// Package is one installed package of the guest.
type Package struct {
	// Type is the package manager's package-URL type: deb, rpm or apk.
	Type string `json:"type"`
	Name string `json:"name"`
	// Version is the manager's own version string: dpkg's with its epoch
	// ("1:2.36-9"), rpm's version-release, apk's.
	Version string `json:"version"`
	// Epoch is rpm's epoch, when the package has one.
	Epoch string `json:"epoch,omitempty"`
	Arch  string `json:"arch,omitempty"`
	// Source is the source package, when it is named otherwise.
	Source string `json:"source,omitempty"`
}

// ErrNoDatabase is matched by a reader's error when the guest has no
// database of that kind.
var ErrNoDatabase = errors.New("no package database")

// ReadDpkg lists the packages dpkg says are installed
// (/var/lib/dpkg/status, "Status: install ok installed").
func ReadDpkg(fsys fs.FS) ([]Package, error) {
	return readDatabase(fsys, "/var/lib/dpkg/status", maxDpkgStatus, parseDpkgStatus)
}

// parseDpkgStatus reads the stanzas of a dpkg status file.
func parseDpkgStatus(b []byte) ([]Package, error) {
	var out []Package
	var p Package
	installed := false
	err := scanStanzas(b, func(line string) {
		if line[0] == ' ' || line[0] == '\t' {
			return // a continuation (descriptions, conffiles)
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			return
		}
		v = strings.TrimSpace(v)
		switch k {
		case "Package":
			p.Name, p.Type = v, "deb"
		case "Version":
			p.Version = v
		case "Architecture":
			p.Arch = v
		case "Source":
			// "Source: name (version)" when the versions differ.
			p.Source, _, _ = strings.Cut(v, " ")
		case "Status":
			installed = v == "install ok installed"
		}
	}, func() (err error) {
		if installed {
			out, err = addPackage(out, p)
		}
		p, installed = Package{}, false
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
