package intake

import (
	"cmp"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/imagepipe/imagepipe/internal/registry"
)

var _ TagRegistry = (*registry.Client)(nil)

// servedTenants plays the hub's tenancy: it serves the tenants listed,
// every tenant when the list is empty, each in the namespace of its name.
type servedTenants []string

func (s servedTenants) Namespace(repository string) (string, string, error) {
	tenant, _, ok := strings.Cut(repository, "/")
	if !ok || (len(s) > 0 && !slices.Contains(s, tenant)) {
		return "", "", fmt.Errorf("tenant of %q is not served", repository)
	}
	return tenant, tenant, nil
}

// frontedRegistry is the in-process go-containerregistry registry behind a
// front that plays two things it does not do: a registry that sends an
// ETag with each tag listing and answers 304 to a matching If-None-Match
// (etags), and one that fails (requests whose "METHOD path" is in failing
// are answered 500).
type frontedRegistry struct {
	inner http.Handler
	etags bool

	mu      sync.Mutex
	failing map[string]bool
	// notRegistry: every request but GET /v2/ is answered 404 text/html,
	// like an ingress whose backend is gone.
	notRegistry bool
}

// fail makes the registry answer 500 to "METHOD path" (or stop doing so).
func (f *frontedRegistry) fail(request string, on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failing[request] = on
}

func (f *frontedRegistry) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	failing := f.failing[r.Method+" "+r.URL.Path]
	notRegistry := f.notRegistry
	f.mu.Unlock()
	if notRegistry && r.URL.Path != "/v2/" {
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, "<html><body><h1>404 Not Found</h1>default backend</body></html>")
		return
	}
	if failing {
		http.Error(w, "failing as asked", http.StatusInternalServerError)
		return
	}
	if !f.etags || r.Method != http.MethodGet || !strings.HasSuffix(r.URL.Path, "/tags/list") {
		f.inner.ServeHTTP(w, r)
		return
	}
	rec := httptest.NewRecorder()
	f.inner.ServeHTTP(rec, r)
	if rec.Code == http.StatusOK {
		etag := fmt.Sprintf(`"%x"`, sha256.Sum256(rec.Body.Bytes()))
		w.Header().Set("ETag", etag)
		if r.Header.Get("If-None-Match") == etag {
			w.WriteHeader(http.StatusNotModified)
			return
		}
	}
	w.WriteHeader(rec.Code)
	w.Write(rec.Body.Bytes())
}

// pollFixture is a registry to poll and the means to change it.
type pollFixture struct {
	t     *testing.T
	host  string
	front *frontedRegistry
}

func newPollFixture(t *testing.T, etags bool) *pollFixture {
	front := &frontedRegistry{inner: ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0))), etags: etags, failing: map[string]bool{}}
	srv := httptest.NewServer(front)
	t.Cleanup(srv.Close)
	return &pollFixture{t: t, host: strings.TrimPrefix(srv.URL, "http://"), front: front}
}

// push pushes a new random image to repo:tag and returns its digest.
func (f *pollFixture) push(repo, tag string) string {
	f.t.Helper()
	img, err := random.Image(64, 1)
	if err != nil {
		f.t.Fatal(err)
	}
	if err := remote.Write(f.tag(repo, tag), img); err != nil {
		f.t.Fatal(err)
	}
	d, err := img.Digest()
	if err != nil {
		f.t.Fatal(err)
	}
	return d.String()
}

// untag deletes the tag repo:tag.
func (f *pollFixture) untag(repo, tag string) {
	f.t.Helper()
	if err := remote.Delete(f.tag(repo, tag)); err != nil {
		f.t.Fatal(err)
	}
}

func (f *pollFixture) tag(repo, tag string) name.Tag {
	f.t.Helper()
	ref, err := name.NewTag(f.host + "/" + repo + ":" + tag)
	if err != nil {
		f.t.Fatal(err)
	}
	return ref
}

func push(repo, tag, digest string) Event {
	return Event{Action: ActionPush, Repository: repo, Tag: tag, Digest: digest, Source: "poll"}
}

func del(repo, tag, digest string) Event {
	return Event{Action: ActionDelete, Repository: repo, Tag: tag, Digest: digest, Source: "poll"}
}

// TestPoller runs the passes of a Poller over a registry that changes
// between them, once where tag listings carry no ETag (the CNCF
// distribution registry) and once where they do.
func TestPoller(t *testing.T) {
	for _, etags := range []bool{false, true} {
		t.Run(fmt.Sprintf("etags=%v", etags), func(t *testing.T) {
			f := newPollFixture(t, etags)
			d := map[string]string{
				"a:1": f.push("acme/a", "1"),
				"a:2": f.push("acme/a", "2"),
				"b:1": f.push("acme/b", "1"),
			}
			f.push("other/c", "1")
			var requests atomic.Int64
			client, err := registry.New(registry.WithCacheDir(""), registry.WithRetry(1, time.Millisecond),
				registry.WithRequestObserver(func(string, string, int) { requests.Add(1) }))
			if err != nil {
				t.Fatal(err)
			}
			tenancy := servedTenants{"acme"}
			reg, err := name.NewRegistry(f.host)
			if err != nil {
				t.Fatal(err)
			}
			p := NewPoller(reg, client, tenancy)

			steps := []struct {
				name   string
				change func()
				full   bool
				want   func() []Event
				bad    bool
				// registry requests the pass may take; 0: not counted
				requests int64
			}{
				{
					name: "the first pass learns every served tag",
					want: func() []Event {
						return []Event{push("acme/a", "1", d["a:1"]), push("acme/a", "2", d["a:2"]), push("acme/b", "1", d["b:1"])}
					},
				},
				{
					name:     "no change costs the catalog and one listing per repository",
					requests: 1 + 2,
				},
				{
					name:     "a tag pushed again leaves the listing as it was: a fast pass misses it",
					change:   func() { d["a:1"] = f.push("acme/a", "1") },
					requests: 1 + 2,
				},
				{
					name:     "a full pass looks up every tag and finds it",
					full:     true,
					want:     func() []Event { return []Event{push("acme/a", "1", d["a:1"])} },
					requests: 1 + 2 + 3,
				},
				{
					name:     "a new tag is looked up once",
					change:   func() { d["b:2"] = f.push("acme/b", "2") },
					want:     func() []Event { return []Event{push("acme/b", "2", d["b:2"])} },
					requests: 1 + 2 + 1,
				},
				{
					name:     "a tag gone from the listing is deleted once a look-up confirms it",
					change:   func() { f.untag("acme/a", "2") },
					want:     func() []Event { return []Event{del("acme/a", "2", d["a:2"])} },
					requests: 1 + 2 + 2, // the HEAD's 404, then the GET whose body says MANIFEST_UNKNOWN
				},
				{
					name: "a listing that fails deletes nothing",
					change: func() {
						f.untag("acme/b", "2")
						f.front.fail("GET /v2/acme/b/tags/list", true)
					},
					bad: true,
				},
				{
					name:   "once the listing answers, the delete is confirmed",
					change: func() { f.front.fail("GET /v2/acme/b/tags/list", false) },
					want:   func() []Event { return []Event{del("acme/b", "2", d["b:2"])} },
				},
				{
					name: "a look-up that fails deletes nothing",
					change: func() {
						f.untag("acme/b", "1")
						f.front.fail("HEAD /v2/acme/b/manifests/1", true)
					},
					bad: true,
				},
				{
					name:   "once the look-up answers, the delete is confirmed",
					change: func() { f.front.fail("HEAD /v2/acme/b/manifests/1", false) },
					want:   func() []Event { return []Event{del("acme/b", "1", d["b:1"])} },
				},
				{
					name: "a new tag whose look-up fails is not learnt",
					change: func() {
						d["a:3"] = f.push("acme/a", "3")
						f.front.fail("HEAD /v2/acme/a/manifests/3", true)
					},
					bad: true,
				},
				{
					name:   "it is listed and looked up again on the next pass",
					change: func() { f.front.fail("HEAD /v2/acme/a/manifests/3", false) },
					want:   func() []Event { return []Event{push("acme/a", "3", d["a:3"])} },
				},
				{
					name: "a catalog that fails changes nothing",
					change: func() {
						f.untag("acme/a", "1")
						f.front.fail("GET /v2/_catalog", true)
					},
					full: true,
					bad:  true,
				},
				{
					name:   "once the catalog answers, the delete is confirmed",
					change: func() { f.front.fail("GET /v2/_catalog", false) },
					want:   func() []Event { return []Event{del("acme/a", "1", d["a:1"])} },
				},
			}
			for _, st := range steps {
				if st.change != nil {
					st.change()
				}
				requests.Store(0)
				pass := p.Poll
				if st.full {
					pass = p.PollDigests
				}
				got, err := pass(t.Context())
				if (err != nil) != st.bad {
					t.Fatalf("%s: error %v", st.name, err)
				}
				slices.SortFunc(got, func(a, b Event) int {
					return cmp.Or(strings.Compare(a.Repository, b.Repository), strings.Compare(a.Tag, b.Tag))
				})
				var want []Event
				if st.want != nil {
					want = st.want()
				}
				if !slices.Equal(got, want) {
					t.Errorf("%s: %+v, want %+v", st.name, got, want)
				}
				if n := requests.Load(); st.requests != 0 && n != st.requests {
					t.Errorf("%s: %d registry requests, want %d", st.name, n, st.requests)
				}
			}
		})
	}
}

// TestResolveNeedsTheRegistrysOwn404: a 404 that does not carry the
// registry's error (an ingress default backend) is an error, not a deleted
// tag; a poll then deletes nothing. Once the registry answers again, a tag
// really deleted is confirmed.
func TestResolveNeedsTheRegistrysOwn404(t *testing.T) {
	f := newPollFixture(t, false)
	digest := f.push("acme/a", "1")
	client, err := registry.New(registry.WithCacheDir(""), registry.WithRetry(1, time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	tag := f.tag("acme/a", "1")
	if got, found, err := client.Resolve(t.Context(), tag); err != nil || !found || got != digest {
		t.Fatalf("Resolve before: %q %v %v", got, found, err)
	}
	tenancy := servedTenants{}
	p := NewPoller(tag.Registry, client, tenancy)
	if ev, err := p.PollDigests(t.Context()); err != nil || len(ev) != 1 {
		t.Fatalf("first poll: %+v %v", ev, err)
	}

	f.front.mu.Lock()
	f.front.notRegistry = true
	f.front.mu.Unlock()
	_, found, err := client.Resolve(t.Context(), tag)
	if !errors.Is(err, registry.ErrNotRegistry) || found {
		t.Errorf("Resolve behind a default backend: found %v, error %v; want ErrNotRegistry", found, err)
	}
	if ev, err := p.PollDigests(t.Context()); err == nil || len(ev) != 0 {
		t.Errorf("poll behind a default backend: events %+v, error %v; want an error and no event", ev, err)
	}

	f.front.mu.Lock()
	f.front.notRegistry = false
	f.front.mu.Unlock()
	f.untag("acme/a", "1")
	if _, found, err := client.Resolve(t.Context(), tag); err != nil || found {
		t.Errorf("Resolve of a deleted tag: found %v, error %v; want not found", found, err)
	}
	if ev, err := p.PollDigests(t.Context()); err != nil || !slices.Equal(ev, []Event{del("acme/a", "1", digest)}) {
		t.Errorf("poll after the delete: %+v %v", ev, err)
	}
}
