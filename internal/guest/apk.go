package guest

import (
	"bufio"
	"bytes"
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
	return readDatabase(fsys, "/lib/apk/db/installed", maxAPKInstalled, parseAPKInstalled)
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
