package diskimage

import (
	"errors"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/imagepipe/imagepipe/internal/containerdisk"
	"github.com/imagepipe/imagepipe/internal/disktest"
	"github.com/imagepipe/imagepipe/internal/publish"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// TestListDescribesTheTenantsImages: List names every tag of the
// tenant's repositories, sorted, with what imagectl's annotations say of
// each image (empty for an image imagepipe did not build), and nothing of
// another tenant's; ListRepository lists one repository alike.
func TestListDescribesTheTenantsImages(t *testing.T) {
	host := disktest.Registry(t)
	c := testClient(t)
	src := disktest.Disk(t, 4<<20, 9)
	var built []*api.ImportResult
	for _, ref := range []string{"/acme/b:1", "/acme/a:2", "/other/c:1"} {
		res, err := importer(c).Import(t.Context(), disktest.MustTag(t, host+ref), src.ContainerDisk(t, containerdisk.Options{}), src, publish.ImportOptions{})
		if err != nil {
			t.Fatal(err)
		}
		built = append(built, res)
	}
	foreign, err := random.Image(256, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(disktest.MustTag(t, host+"/acme/a:x"), foreign); err != nil {
		t.Fatal(err)
	}
	foreignDigest, _ := foreign.Digest()

	reg, _ := name.NewRegistry(host)
	got, err := List(t.Context(), c, reg, "acme")
	if err != nil {
		t.Fatal(err)
	}
	want := []api.ImageListing{
		{Repository: host + "/acme/a", Tag: "2", Digest: built[1].Digest, DiskFormat: "qcow2", SourceDigest: src.Digest, VirtualSize: 4 << 20},
		{Repository: host + "/acme/a", Tag: "x", Digest: foreignDigest.String()},
		{Repository: host + "/acme/b", Tag: "1", Digest: built[0].Digest, DiskFormat: "qcow2", SourceDigest: src.Digest, VirtualSize: 4 << 20},
	}
	if len(got) != len(want) {
		t.Fatalf("listed %+v; want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("listing %d: %+v; want %+v", i, got[i], want[i])
		}
	}
	one, err := ListRepository(t.Context(), c, reg.Repo("acme/b"))
	if err != nil || len(one) != 1 || one[0] != want[2] {
		t.Errorf("ListRepository: %+v, %v; want %+v", one, err, want[2])
	}
	if none, err := ListRepository(t.Context(), c, reg.Repo("acme/none")); err != nil || len(none) != 0 {
		t.Errorf("ListRepository of a repository that does not exist: %+v, %v", none, err)
	}
	var cat *CatalogError
	if _, err := List(t.Context(), c, disktest.MustTag(t, "127.0.0.1:1/acme/x:1").Registry, "acme"); !errors.As(err, &cat) || cat.Tenant != "acme" {
		t.Errorf("an unreachable catalog: %v", err)
	}
}
