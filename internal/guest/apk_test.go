package guest

import (
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
)

// alpineInstalled is apk's installed database in its documented format
// (apk-tools' doc/apk-v2 "installed" file: a stanza per package, one
// field per line, the file list as F:/R:/a:/Z: lines), with the fields
// of Alpine 3.20's musl, busybox and a virtual package without a
// version, which apk does not list.
const alpineInstalled = `C:Q1Deb0jNytkrjPW4N/eKLZ43BwOlw=
P:musl
V:1.2.5-r0
A:x86_64
S:407173
I:662528
T:the musl c library (libc) implementation
U:https://musl.libc.org/
L:MIT
o:musl
m:Natanael Copa <ncopa@alpinelinux.org>
t:1711983236
c:9cf0b4d7e9e5e5d2d7bd9d4e55bd7d8ccf8f4b53
p:so:libc.musl-x86_64.so.1=1
F:lib
R:ld-musl-x86_64.so.1
a:0:0:755
Z:Q12adwqQOjo9dFl+VJD2Ecd901vhE=

C:Q1qKcZ+j23xssAXmgQhkOO8dHnbWw=
P:busybox-binsh
V:1.36.1-r29
A:x86_64
o:busybox
F:bin
R:sh
a:0:0:777

P:.virtual-build
A:noarch

`

// TestAPKAsAlpineWritesIt: apk's installed database lists its packages
// with their origin when it differs; a stanza without a version is not a
// package.
func TestAPKAsAlpineWritesIt(t *testing.T) {
	root := t.TempDir()
	write(t, root+"/lib/apk/db/installed", alpineInstalled)
	manager, pkgs, err := ListPackages(os.DirFS(root))
	want := []Package{
		{Type: "apk", Name: "musl", Version: "1.2.5-r0", Arch: "x86_64"},
		{Type: "apk", Name: "busybox-binsh", Version: "1.36.1-r29", Arch: "x86_64", Source: "busybox"},
	}
	if err != nil || manager != "apk" || !slices.Equal(pkgs, want) {
		t.Errorf("%s %+v, %v; want apk %+v", manager, pkgs, err, want)
	}
}

// TestAPKHostile: a database over its bound and a line over its bound
// are errors, no database is ErrNoDatabase.
func TestAPKHostile(t *testing.T) {
	if _, err := ReadAPK(os.DirFS(t.TempDir())); !errors.Is(err, ErrNoDatabase) {
		t.Errorf("no database: %v", err)
	}
	big := t.TempDir()
	write(t, big+"/lib/apk/db/installed", alpineInstalled)
	if err := os.Truncate(big+"/lib/apk/db/installed", maxAPKInstalled+1); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadAPK(os.DirFS(big)); !errors.Is(err, ErrTooLarge) {
		t.Errorf("over its bound: %v", err)
	}
	long := t.TempDir()
	write(t, long+"/lib/apk/db/installed", "P:x\nV:"+strings.Repeat("1", maxDpkgLine+1)+"\n")
	if p, err := ReadAPK(os.DirFS(long)); err == nil {
		t.Errorf("a line over its bound: %+v", p)
	}
}
