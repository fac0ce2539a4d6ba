package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/pem"
	"fmt"
	"io"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/crypto/x509roots/fallback/bundle"
)

// The user the images run as, and the paths they hold.
const (
	nonrootUID   = 65532
	caBundlePath = "/etc/ssl/certs/ca-certificates.crt"
	binDir       = "/usr/local/bin"
	homeDir      = "/home/nonroot"
)

// entry is one file or directory of a layer.
type entry struct {
	name     string // without the leading "/"; directories end in "/"
	mode     int64
	uid, gid int
	body     []byte // nil for a directory
}

func dir(name string, mode int64, uid int) entry {
	return entry{name: name, mode: mode, uid: uid, gid: uid}
}

func file(name string, mode int64, body []byte) entry {
	return entry{name: name, mode: mode, body: body}
}

// baseEntries are the files every image shares: the users, a home and
// /tmp for the user, and the CA bundle.
func baseEntries() ([]entry, error) {
	certs, err := caBundle()
	if err != nil {
		return nil, err
	}
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:%s:/sbin/nologin\n", nonrootUID, nonrootUID, homeDir)
	group := fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", nonrootUID)
	return []entry{
		dir("etc/", 0o755, 0),
		file("etc/group", 0o644, []byte(group)),
		file("etc/passwd", 0o644, []byte(passwd)),
		dir("etc/ssl/", 0o755, 0),
		dir("etc/ssl/certs/", 0o755, 0),
		file(caBundlePath[1:], 0o644, certs),
		dir("home/", 0o755, 0),
		dir(homeDir[1:]+"/", 0o700, nonrootUID),
		dir("root/", 0o700, 0),
		dir("tmp/", 0o1777, 0),
	}, nil
}

// binaryEntries put one binary at /usr/local/bin/NAME.
func binaryEntries(name string, binary []byte) []entry {
	return []entry{
		dir("usr/", 0o755, 0),
		dir("usr/local/", 0o755, 0),
		dir(binDir[1:]+"/", 0o755, 0),
		file(binDir[1:]+"/"+name, 0o755, binary),
	}
}

// caBundle is the PEM bundle of the Mozilla roots that
// golang.org/x/crypto/x509roots/fallback/bundle carries, in its order. A
// root that Mozilla distrusts after a date (Root.Constraint) is left out:
// a PEM file cannot say so, and trusting it without the limit would
// trust what Mozilla no longer does.
func caBundle() ([]byte, error) {
	var b bytes.Buffer
	n := 0
	for root := range bundle.Roots() {
		if root.Constraint != nil {
			continue
		}
		if err := pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: root.Certificate}); err != nil {
			return nil, fmt.Errorf("encoding a root certificate: %w", err)
		}
		n++
	}
	if n == 0 {
		return nil, fmt.Errorf("the x509roots bundle has no unconstrained root")
	}
	return b.Bytes(), nil
}

// tarLayer writes entries as an uncompressed tar with every time set to
// mtime and no user or group names, so that the same entries always give
// the same bytes, and wraps it as a gzip-compressed OCI layer.
func tarLayer(entries []entry, mtime time.Time) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{
			Name:    e.name,
			Mode:    e.mode,
			Uid:     e.uid,
			Gid:     e.gid,
			ModTime: mtime,
			Format:  tar.FormatPAX,
		}
		if e.body == nil {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag = tar.TypeReg
			h.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("writing the tar header of %s: %w", e.name, err)
		}
		if _, err := tw.Write(e.body); err != nil {
			return nil, fmt.Errorf("writing %s: %w", e.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("closing the tar: %w", err)
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressionLevel(gzip.DefaultCompression), tarball.WithCompressedCaching)
}
