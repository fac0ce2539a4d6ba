package verdict

import (
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/imagepipe/imagepipe/internal/disktest"
	"github.com/imagepipe/imagepipe/internal/registry"
)

// TestAttachesAtOnceAreEachReadBack: on a registry without the referrers
// API (go-containerregistry's), writers attaching to one subject at once
// each extend the referrers tag from what they read, and drop each other's
// entries. Each attachment succeeds all the same, naming a referrers tag
// index that lists it. Attaching the same artifact again lists it once.
func TestAttachesAtOnceAreEachReadBack(t *testing.T) {
	srv := httptest.NewServer(ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	c, err := registry.New(registry.WithCacheDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	subject, desc := disktest.PushRandomSubject(t, strings.TrimPrefix(srv.URL, "http://")+"/acme/rhel")
	note := func(i int) Artifact {
		return Artifact{ArtifactType: "application/vnd.example.note", MediaType: "text/plain", Content: fmt.Appendf(nil, "note %d", i),
			Annotations: map[string]string{"example.note": fmt.Sprint(i)}}
	}

	const writers = 8
	attached := make([]Attached, writers)
	errs := make([]error, writers)
	var wg sync.WaitGroup
	for i := range writers {
		wg.Go(func() { attached[i], errs[i] = Attach(t.Context(), c, subject, desc, note(i)) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("attach %d: %v", i, err)
		}
	}
	for i, a := range attached {
		if a.ReferrersTag == "" {
			t.Errorf("attach %d: no referrers tag index named; want the one read back", i)
			continue
		}
		idx, err := c.FetchManifest(t.Context(), subject.Context().Digest(a.ReferrersTag))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(idx.Bytes), a.Digest) {
			t.Errorf("attach %d: the referrers tag index %s does not list %s", i, a.ReferrersTag, a.Digest)
		}
	}

	again, err := Attach(t.Context(), c, subject, desc, note(0))
	if err != nil {
		t.Fatal(err)
	}
	if again.Digest != attached[0].Digest {
		t.Errorf("the same artifact attached again is %s, first %s; want the same manifest", again.Digest, attached[0].Digest)
	}
	refs, _, err := c.Referrers(t.Context(), subject, "")
	if err != nil {
		t.Fatal(err)
	}
	if n := slices.IndexFunc(refs, func(r v1.Descriptor) bool { return r.Digest.String() == again.Digest }); n < 0 || slices.ContainsFunc(refs[n+1:], func(r v1.Descriptor) bool { return r.Digest.String() == again.Digest }) {
		t.Errorf("after attaching one again: %v; want it listed once", refs)
	}
}
