package gate

import (
	"bytes"
	"crypto"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/imagepipe/imagepipe/internal/containerdisk"
	"github.com/imagepipe/imagepipe/internal/convert"
	"github.com/imagepipe/imagepipe/internal/publish"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/imagepipe/imagepipe/internal/attest"
	"github.com/imagepipe/imagepipe/internal/guest"
	"github.com/imagepipe/imagepipe/internal/need"
	"github.com/imagepipe/imagepipe/internal/verdict"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// TestTheVerdictSaysWhatTheDiskHolds: the verdict carries what the disk
// holds, as guest.Inspect read it: here an ext4 filesystem on the whole
// disk, made by mkfs.ext4, with Debian's os-release and cloud-init. A raw
// disk pushed by another client is read in the spool; imagectl's qcow2,
// verified as it streams, from its copy there, unless its data passes
// the verification's spool share: then the guest is unknown and says why,
// and the image is accepted all the same, as is a disk of random bytes.
func TestTheVerdictSaysWhatTheDiskHolds(t *testing.T) {
	disk := ext4Disk(t, map[string]string{
		"etc/os-release":     "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nVERSION_ID=\"12\"\nID=debian\n",
		"usr/bin/cloud-init": "#!/usr/bin/python3\n",
	})
	debian := func(g *api.GuestReport) bool {
		return g != nil && g.PartitionTable == "none" && g.Filesystem == "ext4" && g.OS != nil && g.OS.ID == "debian" && g.OS.VersionID == "12" && g.CloudInit
	}
	crafted := func(disk []byte) func(*testing.T, *env, string) string {
		return func(t *testing.T, e *env, repo string) string { return craftImage(t, disk).push(t, e, repo) }
	}
	imagectl := func(t *testing.T, e *env, repo string) string {
		return e.importDisk(t, repo, disk, containerdisk.Options{DiskFormat: convert.FormatQCOW2, Compression: containerdisk.CompressionZstd}, publish.ImportOptions{})
	}

	e := newEnv(t)
	var logs bytes.Buffer
	e.v.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	for _, tc := range []struct {
		name     string
		push     func(*testing.T, *env, string) string
		maxSpool int64
		want     func(*api.GuestReport) bool
		streamed bool
	}{
		{name: "debian", push: crafted(disk), want: debian},
		{name: "random", push: crafted(rawDisk(t, 4<<20, 41)), want: func(g *api.GuestReport) bool {
			return g != nil && g.OS == nil && len(g.Notes) > 0
		}},
		{name: "imagectl", push: imagectl, want: debian, streamed: true},
		{name: "over-the-share", push: imagectl, maxSpool: 64 << 10, streamed: true, want: func(g *api.GuestReport) bool {
			return g != nil && g.OS == nil && len(g.Notes) == 1 && strings.Contains(g.Notes[0], "spool share")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e.v.MaxSpool = tc.maxSpool
			logs.Reset()
			d := tc.push(t, e, "acme/"+tc.name)
			v, err := e.v.Verify(t.Context(), mustDigest(t, e.host+"/acme/"+tc.name+"@"+d))
			if err != nil || v.Verdict != api.VerdictAccepted || len(v.Images) != 1 {
				t.Fatalf("%+v, %v", v, err)
			}
			if g := v.Images[0].Guest; !tc.want(g) {
				t.Errorf("the verdict's guest: %+v", g)
			}
			if streamed := strings.Contains(logs.String(), "streamed=true"); streamed != tc.streamed {
				t.Errorf("verified as it streamed: %v, want %v\n%s", streamed, tc.streamed, logs.String())
			}
		})
	}
}

// TestAGuestThatRunsAwayCostsOnlyItsReport: the guest is read in a
// process of its own, which bounds its memory (RLIMIT_DATA) and CPU time
// (RLIMIT_CPU) itself; readers that run past either (played here by the
// test binary, as inspect-one bounds itself) cost the image its guest
// report, a note saying why, never its verdict.
func TestAGuestThatRunsAwayCostsOnlyItsReport(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t)
	e.v.Inspector = &Inspector{Path: exe, MemoryLimit: 192 << 20, CPULimit: time.Second}
	for _, tc := range []struct{ mode, want string }{
		// The runtime's own words differ (out of memory, cannot allocate
		// it; the race detector's allocator fails otherwise).
		{"inspect-hog", "its process ended (exit status"},
		{"inspect-spin", "CPU time limit of 1s"},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			t.Setenv("PLAY_GATE_CHILD", tc.mode)
			d := craftImage(t, rawDisk(t, 4<<20, 43)).push(t, e, "acme/"+tc.mode)
			v, err := e.v.Verify(t.Context(), mustDigest(t, e.host+"/acme/"+tc.mode+"@"+d))
			if err != nil || v.Verdict != api.VerdictAccepted || len(v.Images) != 1 {
				t.Fatalf("%+v, %v; want accepted", v, err)
			}
			g := v.Images[0].Guest
			if g == nil || g.OS != nil || len(g.Notes) != 1 || !strings.Contains(g.Notes[0], tc.want) {
				t.Errorf("the guest report: %+v; want one note saying %q", g, tc.want)
			}
		})
	}
}

// debianDisk is a raw ext4 disk, made by mkfs.ext4, holding Debian's
// os-release and a dpkg status file listing status.
func debianDisk(t *testing.T, status string) []byte {
	t.Helper()
	return ext4Disk(t, map[string]string{
		"etc/os-release":      "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nVERSION_ID=\"12\"\nID=debian\n",
		"var/lib/dpkg/status": status,
	})
}

// ext4Disk is a raw 16 MiB disk holding an ext4 filesystem that mkfs.ext4
// made of files (paths relative to its root, and their text).
func ext4Disk(t *testing.T, files map[string]string) []byte {
	t.Helper()
	mkfs := need.Program(t, "mkfs.ext4")
	root := t.TempDir()
	for name, text := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	img := filepath.Join(t.TempDir(), "disk.raw")
	if err := os.WriteFile(img, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 16<<20); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(mkfs, "-q", "-F", "-d", root, img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v\n%s", err, out)
	}
	disk, err := os.ReadFile(img)
	if err != nil {
		t.Fatal(err)
	}
	return disk
}

const testDpkgStatus = `Package: libc6
Status: install ok installed
Architecture: amd64
Source: glibc
Version: 2.36-9+deb12u4

Package: evil
Status: install ok installed
Architecture: amd64
Source: x@y?z (1)
Version: 1.0/2 @?&=

Package: gone
Status: deinstall ok config-files
Architecture: amd64
Version: 1
`

// TestTheGuestsSBOMIsAttachedAndPublishedAgainWithoutARead: an accepted
// image whose guest lists dpkg packages gets, beside its verdict, a
// CycloneDX SBOM signed by the gate's key as an attestation of the pushed
// digest, listing the installed packages with their purls. A tenant that
// hides the referrers gets both back from the gate's store, without the
// layer being read again; a checker trusting another key finds none.
func TestTheGuestsSBOMIsAttachedAndPublishedAgainWithoutARead(t *testing.T) {
	e := newEnv(t)
	signer := newSigner(t)
	s, counter := e.service(t, signer)
	store := &Store{Dir: t.TempDir()}
	s.Store, s.Verifier.Store = store, store
	d := craftImage(t, debianDisk(t, testDpkgStatus)).push(t, e, "acme/deb")
	subject := mustDigest(t, e.host+"/acme/deb@"+d)
	checker, err := attest.NewKeyChecker([]crypto.PublicKey{signer.Public()})
	if err != nil {
		t.Fatal(err)
	}
	purls := func() []string {
		t.Helper()
		pred, err := verdict.FindStatement(t.Context(), e.reg, checker, subject, attest.CycloneDXPredicateType)
		if err != nil {
			t.Fatalf("the SBOM: %v", err)
		}
		var bom struct {
			Metadata struct {
				Component struct{ Version string }
			}
			Components []struct {
				Type, Name, Purl string
			}
		}
		if err := json.Unmarshal(pred, &bom); err != nil {
			t.Fatal(err)
		}
		if bom.Metadata.Component.Version != d {
			t.Errorf("the SBOM describes %q, not the pushed digest %s", bom.Metadata.Component.Version, d)
		}
		var out []string
		for _, c := range bom.Components {
			out = append(out, c.Type+" "+c.Name+" "+c.Purl)
		}
		return out
	}
	want := []string{
		"operating-system debian ",
		"library libc6 pkg:deb/debian/libc6@2.36-9%2Bdeb12u4?arch=amd64&distro=debian-12&upstream=glibc",
		"library evil pkg:deb/debian/evil@1.0%2F2%20%40%3F%26%3D?arch=amd64&distro=debian-12&upstream=x%40y%3Fz",
	}
	v, err := s.Handle(t.Context(), subject)
	if err != nil || v.Verdict != api.VerdictAccepted || v.Images[0].Guest.Packages == nil || v.Images[0].Guest.Packages.Count != 2 {
		t.Fatalf("%+v, %v", v, err)
	}
	if got := purls(); !slices.Equal(got, want) {
		t.Errorf("the SBOM lists\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	reads := counter.total()
	s.memory.Forget(subject.String())
	hideVerdicts(t, e, subject)
	if _, err := verdict.FindStatement(t.Context(), e.reg, checker, subject, attest.CycloneDXPredicateType); !errors.Is(err, verdict.ErrNoStatement) {
		t.Fatalf("hidden, the SBOM is still found: %v", err)
	}
	if _, err := s.Handle(t.Context(), subject); err != nil {
		t.Fatal(err)
	}
	if got := purls(); !slices.Equal(got, want) {
		t.Errorf("published again, the SBOM lists\n%s", strings.Join(got, "\n"))
	}
	if n := counter.total(); n != reads {
		t.Errorf("publishing the SBOM again cost %d blob reads, want none", n-reads)
	}

	other, _ := attest.NewKeyChecker([]crypto.PublicKey{newSigner(t).Public()})
	if _, err := verdict.FindStatement(t.Context(), e.reg, other, subject, attest.CycloneDXPredicateType); !errors.Is(err, verdict.ErrNoStatement) {
		t.Errorf("another key's checker found the SBOM: %v", err)
	}
}

// TestTheSBOMBundleFitsItsBound: the largest SBOM the gate writes, signed,
// is a bundle readers download (attest.MaxSBOMBundleSize).
func TestTheSBOMBundleFitsItsBound(t *testing.T) {
	if n := int64(guest.MaxBOMSize+2)/3*4 + attest.MaxBundleSize; n > attest.MaxSBOMBundleSize {
		t.Errorf("an SBOM of %d bytes makes a bundle of up to %d bytes, over attest.MaxSBOMBundleSize %d", guest.MaxBOMSize, n, attest.MaxSBOMBundleSize)
	}
}

// TestAnIndexsImagesEachGetTheirSBOM: of an index, each platform's image
// gets the SBOM of its own guest, attached to its own digest (where
// imagectl inspect --platform and cosign look for it); the index itself
// gets none.
func TestAnIndexsImagesEachGetTheirSBOM(t *testing.T) {
	e := newEnv(t)
	signer := newSigner(t)
	s, _ := e.service(t, signer)
	store := &Store{Dir: t.TempDir()}
	s.Store, s.Verifier.Store = store, store
	checker, err := attest.NewKeyChecker([]crypto.PublicKey{signer.Public()})
	if err != nil {
		t.Fatal(err)
	}
	var entries []map[string]any
	images := map[string]string{} // digest: the one package it lists
	for _, arch := range []string{"amd64", "arm64"} {
		pkg := "only-on-" + arch
		img := craftImage(t, debianDisk(t, "Package: "+pkg+"\nStatus: install ok installed\nArchitecture: "+arch+"\nVersion: 1\n"))
		img.config.Architecture = arch
		d := img.push(t, e, "acme/multi")
		m, err := e.reg.FetchManifest(t.Context(), mustDigest(t, e.host+"/acme/multi@"+d))
		if err != nil {
			t.Fatal(err)
		}
		images[d] = pkg
		entries = append(entries, map[string]any{"mediaType": ocispec.MediaTypeImageManifest, "digest": d, "size": len(m.Bytes), "platform": map[string]string{"os": "linux", "architecture": arch}})
	}
	index, _ := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": ocispec.MediaTypeImageIndex, "manifests": entries})
	subject := mustDigest(t, e.host+"/acme/multi@"+e.pushRaw(t, "acme/multi", index, ocispec.MediaTypeImageIndex))
	if v, err := s.Handle(t.Context(), subject); err != nil || v.Verdict != api.VerdictAccepted || len(v.Images) != 2 {
		t.Fatalf("%+v, %v", v, err)
	}
	for d, pkg := range images {
		pred, err := verdict.FindStatement(t.Context(), e.reg, checker, mustDigest(t, e.host+"/acme/multi@"+d), attest.CycloneDXPredicateType)
		if err != nil {
			t.Fatalf("the SBOM of %s: %v", pkg, err)
		}
		if !strings.Contains(string(pred), `"name":"`+pkg+`"`) || strings.Count(string(pred), `"type":"library"`) != 1 {
			t.Errorf("the SBOM of the image with %s: %s", pkg, pred)
		}
	}
	if _, err := verdict.FindStatement(t.Context(), e.reg, checker, subject, attest.CycloneDXPredicateType); !errors.Is(err, verdict.ErrNoStatement) {
		t.Errorf("the index has an SBOM: %v", err)
	}
}

// TestAPackageListOverItsBoundIsNotKept: a guest's package list is kept
// and read back as it was; one whose JSON could pass the store's bound
// (control bytes take 6 bytes each) is refused before it is encoded, so
// it costs the verification child no memory, and nothing is written.
func TestAPackageListOverItsBoundIsNotKept(t *testing.T) {
	s := &Store{Dir: t.TempDir()}
	ok := &packagesRecord{Key: "k1", OS: &api.GuestOS{ID: "debian"}, Packages: []guest.Package{{Type: "deb", Name: "a<b>\x01", Version: "1"}}}
	if err := s.putPackages(ok); err != nil {
		t.Fatal(err)
	}
	if got, found := s.packages("k1"); !found || !slices.Equal(got.Packages, ok.Packages) || got.OS.ID != "debian" {
		t.Errorf("kept %+v (%v); want %+v", got, found, ok)
	}
	hostile := &packagesRecord{Key: "k2", Packages: []guest.Package{{Type: "deb", Name: strings.Repeat("\x01", maxPackagesRecord/5), Version: "1"}}}
	if err := s.putPackages(hostile); err == nil {
		t.Error("a package list whose JSON passes the bound was kept")
	}
	if _, err := os.Stat(s.path("packages", "k2")); !os.IsNotExist(err) {
		t.Errorf("the list over the bound was written (%v)", err)
	}
}
