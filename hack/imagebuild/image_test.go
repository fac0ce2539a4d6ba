package main

import (
	"archive/tar"
	"crypto/x509"
	"encoding/pem"
	"io"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/x509roots/fallback/bundle"
)

func TestTagsCheckInput(t *testing.T) {
	good := options{registry: "registry.example.com/imagepipe", tag: "v1.2.3", version: "v1.2.3-4-gabcdef0-dirty", revision: "abcdef0123456789"}
	tags, err := good.tags()
	if err != nil {
		t.Fatal(err)
	}
	if len(tags) != 3 || tags[0].String() != "registry.example.com/imagepipe/image-syncer:v1.2.3" ||
		tags[1].String() != "registry.example.com/imagepipe/image-gate:v1.2.3" || tags[2].String() != "registry.example.com/imagepipe/imagectl:v1.2.3" {
		t.Errorf("tags %v", tags)
	}
	for _, reg := range []string{"127.0.0.1:5000", "localhost:5000/a/b", "ghcr.io/imagepipe"} {
		o := good
		o.registry = reg
		if _, err := o.tags(); err != nil {
			t.Errorf("-registry %s: %v", reg, err)
		}
	}
	for _, tc := range []struct {
		name   string
		change func(*options)
	}{
		{"a version that would inject linker flags", func(o *options) { o.version = "v1 -X main.evil=1" }},
		{"an empty version", func(o *options) { o.version = "" }},
		{"a version with a quote", func(o *options) { o.version = `v1"` }},
		{"a revision that is not a hash", func(o *options) { o.revision = "HEAD" }},
		{"an upper-case registry", func(o *options) { o.registry = "Registry.example.com/imagepipe" }},
		{"a URL as the registry", func(o *options) { o.registry = "https://registry.example.com/imagepipe" }},
		{"a path with ..", func(o *options) { o.registry = "registry.example.com/../imagepipe" }},
		{"a tag with +", func(o *options) { o.tag = "v1+build" }},
		{"a tag with a slash", func(o *options) { o.tag = "v1/x" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := good
			tc.change(&o)
			if tags, err := o.tags(); err == nil {
				t.Errorf("%+v accepted: %v", o, tags)
			}
		})
	}
}

func TestParseFlags(t *testing.T) {
	t.Setenv("SOURCE_DATE_EPOCH", "1700000000")
	o, err := parseFlags([]string{"-registry", "reg.example/x/", "-version", "v2"})
	if err != nil {
		t.Fatal(err)
	}
	if o.registry != "reg.example/x" || o.tag != "v2" || o.sourceDateEpoch != 1700000000 || !o.sbom {
		t.Errorf("parsed %+v", o)
	}
	for _, args := range [][]string{{}, {"-registry", "r/x", "extra"}, {"-registry", ""}} {
		if _, err := parseFlags(args); err == nil {
			t.Errorf("parseFlags(%q) succeeded", args)
		}
	}
	for _, bad := range []string{"soon", "-5", "1.5"} {
		t.Setenv("SOURCE_DATE_EPOCH", bad)
		if _, err := parseFlags([]string{"-registry", "r/x", "-version", "v"}); err == nil {
			t.Errorf("SOURCE_DATE_EPOCH=%s accepted", bad)
		}
	}
}

func TestLayersAreReproducible(t *testing.T) {
	entries := append(binaryEntries("tool", []byte("\x7fELF binary")), dir("tmp/", 0o1777, 0))
	at := time.Unix(1700000000, 0)
	digest := func(when time.Time) string {
		l, err := tarLayer(entries, when)
		if err != nil {
			t.Fatal(err)
		}
		d, err := l.Digest()
		if err != nil {
			t.Fatal(err)
		}
		return d.String()
	}
	if a, b := digest(at), digest(at); a != b {
		t.Errorf("the same entries gave %s and %s", a, b)
	}
	if a, b := digest(at), digest(at.Add(time.Second)); a == b {
		t.Error("another time gave the same layer: the timestamp is not in the tar")
	}

	l, err := tarLayer(entries, at)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if !h.ModTime.Equal(at) || h.Uname != "" || h.Gname != "" {
			t.Errorf("%s: time %v, names %q:%q", h.Name, h.ModTime, h.Uname, h.Gname)
		}
		switch h.Name {
		case "usr/local/bin/tool":
			if h.Mode != 0o755 || h.Uid != 0 || h.Typeflag != tar.TypeReg {
				t.Errorf("the binary is mode %o, uid %d, type %c", h.Mode, h.Uid, h.Typeflag)
			}
		case "tmp/":
			if h.Mode != 0o1777 || h.Typeflag != tar.TypeDir {
				t.Errorf("/tmp is mode %o, type %c", h.Mode, h.Typeflag)
			}
		}
	}
	if strings.Join(names, " ") != "usr/ usr/local/ usr/local/bin/ usr/local/bin/tool tmp/" {
		t.Errorf("the layer holds %v", names)
	}
}

func TestCABundleIsTheUnconstrainedMozillaRoots(t *testing.T) {
	pemData, err := caBundle()
	if err != nil {
		t.Fatal(err)
	}
	want := 0
	for r := range bundle.Roots() {
		if r.Constraint == nil {
			want++
		}
	}
	got := 0
	for rest := pemData; ; got++ {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		if _, err := x509.ParseCertificate(b.Bytes); err != nil {
			t.Fatalf("root %d: %v", got+1, err)
		}
	}
	if got != want || got < 100 {
		t.Errorf("the bundle has %d roots, want the %d unconstrained ones (over 100)", got, want)
	}
}
