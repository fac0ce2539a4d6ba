package guest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strconv"
	"strings"

	"github.com/imagepipe/imagepipe/pkg/api"
)

// Limits of the file readers; docs/security.md lists them.
const (
	// maxLinks bounds the symbolic links one path may pass, as Linux's
	// MAXSYMLINKS (40) does: a loop ends there.
	maxLinks = 40
	// maxPathDepth bounds the components of a resolved path.
	maxPathDepth = 64
	// maxOSRelease bounds what is read of os-release.
	maxOSRelease = 64 << 10
)

// ErrTooLarge is matched by ReadFile's error for a file over its bound.
var ErrTooLarge = errors.New("the file is larger than its bound")

// OpenFS opens the filesystem at [off, off+size) of r as an fs.FS: ext2,
// ext3 and ext4 (extFS) and XFS (xfs.go), each read by a bounded reader of
// our own. Its files are read with ReadFile, which follows links as the
// guest would, within bounds.
func OpenFS(r io.ReaderAt, off, size int64, filesystem string) (fsys fs.FS, err error) {
	defer recoverAsError(&err)
	switch filesystem {
	case FsExt2, FsExt3, FsExt4:
		return openExt(io.NewSectionReader(r, off, size), size)
	case FsXFS:
		return openXFS(r, off, size)
	}
	return nil, fmt.Errorf("no reader for %q filesystems", filesystem)
}

// linkFS is what ReadFile needs of a filesystem besides Open.
type linkFS interface {
	fs.FS
	Lstat(name string) (fs.FileInfo, error)
	ReadLink(name string) (string, error)
}

// ReadFile reads the file at name (absolute in the guest) from fsys,
// following symbolic links as the guest would, inside the guest's root,
// through at most maxLinks links; a file over limit bytes is ErrTooLarge
// and only limit+1 bytes of it are read. A panic of the filesystem reader
// is an error.
func ReadFile(fsys fs.FS, name string, limit int64) (b []byte, err error) {
	defer recoverAsError(&err)
	f, fi, err := openRegular(fsys, name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi.Size() > limit {
		return nil, fmt.Errorf("%s: %d bytes: %w (%d)", name, fi.Size(), ErrTooLarge, limit)
	}
	b, err = io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s: %w (%d)", name, ErrTooLarge, limit)
	}
	return b, nil
}

// ReadHead reads at most the first n bytes of the file at name, as
// ReadFile finds it, whatever its size.
func ReadHead(fsys fs.FS, name string, n int64) (b []byte, err error) {
	defer recoverAsError(&err)
	f, _, err := openRegular(fsys, name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, n))
}

// openRegular opens the regular file at name as the guest would find it.
func openRegular(fsys fs.FS, name string) (fs.File, fs.FileInfo, error) {
	lfs, resolved, fi, err := lookup(fsys, name)
	if err != nil {
		return nil, nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, nil, fmt.Errorf("%s is not a regular file (%s)", name, fi.Mode().Type())
	}
	f, err := lfs.Open(resolved)
	if err != nil {
		return nil, nil, err
	}
	return f, fi, nil
}

// lookup resolves name (absolute in the guest) in fsys as the guest
// would, and returns the filesystem, the resolved path and what it names.
func lookup(fsys fs.FS, name string) (linkFS, string, fs.FileInfo, error) {
	lfs, ok := fsys.(linkFS)
	if !ok {
		return nil, "", nil, errors.New("the filesystem reader cannot read links")
	}
	resolved, err := resolve(lfs, name)
	if err != nil {
		return nil, "", nil, err
	}
	fi, err := lfs.Lstat(resolved)
	if err != nil {
		return nil, "", nil, err
	}
	return lfs, resolved, fi, nil
}

// resolve returns name with every symbolic link replaced by its target,
// as a path relative to the guest's root (fs.FS form) that names no link
// but possibly its last component's target. ".." never leaves the root.
func resolve(lfs linkFS, name string) (string, error) {
	var done []string // resolved components, none a link
	todo := splitPath(name)
	links := 0
	for len(todo) > 0 {
		c := todo[0]
		todo = todo[1:]
		switch c {
		case ".":
			continue
		case "..":
			if len(done) > 0 {
				done = done[:len(done)-1]
			}
			continue
		}
		if len(done) >= maxPathDepth {
			return "", fmt.Errorf("%s: more than %d components", name, maxPathDepth)
		}
		p := path.Join(append(done, c)...)
		fi, err := lfs.Lstat(p)
		if err != nil {
			return "", err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			done = append(done, c)
			continue
		}
		if links++; links > maxLinks {
			return "", fmt.Errorf("%s: more than %d symbolic links", name, maxLinks)
		}
		target, err := lfs.ReadLink(p)
		if err != nil {
			return "", err
		}
		if strings.HasPrefix(target, "/") {
			done = done[:0]
		}
		todo = append(splitPath(target), todo...)
		if len(todo) > maxPathDepth*maxLinks {
			return "", fmt.Errorf("%s: its links expand past %d components", name, maxPathDepth*maxLinks)
		}
	}
	if len(done) == 0 {
		return ".", nil
	}
	return path.Join(done...), nil
}

func splitPath(p string) []string {
	var out []string
	for c := range strings.SplitSeq(p, "/") {
		if c != "" {
			out = append(out, c)
		}
	}
	return out
}

// ReadOSRelease reads /etc/os-release, else /usr/lib/os-release, as
// os-release(5) says, within maxOSRelease bytes.
func ReadOSRelease(fsys fs.FS) (*api.GuestOS, error) {
	b, err := ReadFile(fsys, "/etc/os-release", maxOSRelease)
	if errors.Is(err, fs.ErrNotExist) {
		b, err = ReadFile(fsys, "/usr/lib/os-release", maxOSRelease)
	}
	if err != nil {
		return nil, err
	}
	return parseOSRelease(b), nil
}

// parseOSRelease reads the shell-style assignments of os-release; values
// are unquoted, and kept only when printable and short.
func parseOSRelease(b []byte) *api.GuestOS {
	var r api.GuestOS
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 4096), 4096)
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), "=")
		if !ok {
			continue
		}
		if u, err := strconv.Unquote(v); err == nil {
			v = u
		} else if len(v) >= 2 && v[0] == '\'' && v[len(v)-1] == '\'' {
			v = v[1 : len(v)-1]
		}
		if len(v) > 256 || strings.IndexFunc(v, func(r rune) bool { return r < 0x20 || r == 0x7f }) >= 0 {
			continue
		}
		switch k {
		case "ID":
			r.ID = v
		case "VERSION_ID":
			r.VersionID = v
		case "PRETTY_NAME":
			r.PrettyName = v
		}
	}
	return &r
}

// recoverAsError turns a panic of a filesystem reader into an error: the
// guest's bytes are hostile, and a reader's bug must cost an "unknown",
// not the verification.
func recoverAsError(err *error) {
	if r := recover(); r != nil {
		*err = fmt.Errorf("the filesystem reader failed: %v", r)
	}
}
