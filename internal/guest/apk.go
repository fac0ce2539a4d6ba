package guest

import (
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
	return readDatabase(fsys, "/lib/apk/db/installed", maxAPKInstalled, parseAPKInstalled)
}

// parseAPKInstalled reads the stanzas of apk's installed database.
func parseAPKInstalled(b []byte) ([]Package, error) {
	var out []Package
	p := Package{Type: "apk"}
	err := scanStanzas(b, func(line string) {
		k, v, ok := strings.Cut(line, ":")
		if !ok || len(k) != 1 {
			return
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
	}, func() (err error) {
		out, err = addPackage(out, p)
		p = Package{Type: "apk"}
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
