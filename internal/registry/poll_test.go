package registry

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/imagepipe/imagepipe/internal/disktest"
)

// request is one request a RequestObserver saw.
type request struct {
	method, path string
	status       int
}

// requestLog records what a RequestObserver sees.
type requestLog struct {
	mu   sync.Mutex
	seen []request
}

func (l *requestLog) observe(method, path string, status int) {
	l.mu.Lock()
	l.seen = append(l.seen, request{method, path, status})
	l.mu.Unlock()
}

// take returns what was seen since the last take, less the GET /v2/ that
// got no answer: go-containerregistry pings a registry on 127.0.0.1 over
// HTTPS and plain HTTP at once, and the HTTPS attempt fails at some point.
func (l *requestLog) take() []request {
	l.mu.Lock()
	defer l.mu.Unlock()
	seen := slices.DeleteFunc(l.seen, func(r request) bool { return r.path == "/v2/" && r.status == 0 })
	l.seen = nil
	return seen
}

// pushRandom pushes a small random image to host/repo:tag, bypassing the
// client under test, and returns its digest.
func pushRandom(t *testing.T, host, repo, tag string) string {
	t.Helper()
	img, err := random.Image(64, 1)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.NewTag(host + "/" + repo + ":" + tag)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

// TestRequestObserver: the observer sees every request once, the session's
// opening GET /v2/ included, and calls on a kept session cost one request.
func TestRequestObserver(t *testing.T) {
	host := disktest.Registry(t)
	pushRandom(t, host, "acme/rhel", "10")
	var log requestLog
	c := testClient(t, WithRequestObserver(log.observe))
	reg, err := name.NewRegistry(host)
	if err != nil {
		t.Fatal(err)
	}
	repo := reg.Repo("acme/rhel")
	steps := []struct {
		name string
		call func() error
		want []request
	}{
		{
			name: "the first call opens the session",
			call: func() error { _, _, err := c.Resolve(t.Context(), repo.Tag("10")); return err },
			want: []request{{"GET", "/v2/", 200}, {"HEAD", "/v2/acme/rhel/manifests/10", 200}},
		},
		{
			// A HEAD answer has no body: the GET reads the registry's own
			// error code, which alone confirms that the tag is gone.
			name: "a tag that does not exist",
			call: func() error { _, _, err := c.Resolve(t.Context(), repo.Tag("9")); return err },
			want: []request{{"HEAD", "/v2/acme/rhel/manifests/9", 404}, {"GET", "/v2/acme/rhel/manifests/9", 404}},
		},
		{
			name: "the catalog",
			call: func() error { _, err := c.Repositories(t.Context(), reg); return err },
			want: []request{{"GET", "/v2/_catalog", 200}},
		},
		{
			name: "a tag listing",
			call: func() error { _, _, _, err := c.ListTags(t.Context(), repo, ""); return err },
			want: []request{{"GET", "/v2/acme/rhel/tags/list", 200}},
		},
	}
	for _, st := range steps {
		if err := st.call(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if got := log.take(); !slices.Equal(got, st.want) {
			t.Errorf("%s: observed %v, want %v", st.name, got, st.want)
		}
	}
	if _, err := New(WithRequestObserver(nil)); err == nil {
		t.Error("a nil observer was accepted")
	}
}

// listingRegistry is the in-process go-containerregistry registry behind a
// front that plays what it does not do itself with tag listings: pages of
// pageSize tags linked by Link headers (pageSize 0: one page), an ETag on
// each page with a 304 answer to a matching If-None-Match (etags), and a
// next-page link to another host (foreignLink).
type listingRegistry struct {
	inner       http.Handler
	pageSize    int
	etags       bool
	foreignLink bool
}

func (l *listingRegistry) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, ok := strings.CutSuffix(r.URL.Path, "/tags/list")
	if r.Method != http.MethodGet || !ok {
		l.inner.ServeHTTP(w, r)
		return
	}
	all := httptest.NewRecorder()
	whole := r.Clone(r.Context())
	whole.URL.RawQuery = ""
	l.inner.ServeHTTP(all, whole)
	if all.Code != http.StatusOK {
		w.WriteHeader(all.Code)
		w.Write(all.Body.Bytes())
		return
	}
	var list struct {
		Name string   `json:"name"`
		Tags []string `json:"tags"`
	}
	if err := json.Unmarshal(all.Body.Bytes(), &list); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	sort.Strings(list.Tags)
	if last := r.URL.Query().Get("last"); last != "" {
		i, _ := slices.BinarySearch(list.Tags, last)
		for i < len(list.Tags) && list.Tags[i] <= last {
			i++
		}
		list.Tags = list.Tags[i:]
	}
	if l.pageSize > 0 && len(list.Tags) > l.pageSize {
		list.Tags = list.Tags[:l.pageSize]
		next := url.URL{Path: r.URL.Path, RawQuery: url.Values{"n": {strconv.Itoa(l.pageSize)}, "last": {list.Tags[l.pageSize-1]}}.Encode()}
		if l.foreignLink {
			next.Scheme, next.Host = "http", "elsewhere.example"
		}
		w.Header().Set("Link", "<"+next.String()+`>; rel="next"`)
	}
	body, _ := json.Marshal(list)
	if l.etags {
		etag := fmt.Sprintf(`"%x"`, sha256.Sum256(body))
		w.Header().Set("ETag", etag)
		if r.Header.Get("If-None-Match") == etag {
			w.WriteHeader(http.StatusNotModified)
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(body)
}

// startListingRegistry starts a listingRegistry and returns its host.
func startListingRegistry(t *testing.T, l *listingRegistry) string {
	t.Helper()
	l.inner = ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(l)
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func TestListTags(t *testing.T) {
	tests := []struct {
		name     string
		registry listingRegistry
		tags     []string // pushed to acme/rhel before listing
		// after the first listing: a tag pushed before the second one ("" for none)
		then          string
		want          []string
		wantETag      bool // the first listing returns an ETag
		wantUnchanged bool // the second listing, with that ETag, is answered 304
		bad           string
	}{
		{
			name: "no ETag: every listing is complete",
			tags: []string{"10", "9", "sha256-" + strings.Repeat("a", 64) + ".sig"},
			want: []string{"10", "9"},
		},
		{
			name:          "ETag: an unchanged listing is not sent again",
			registry:      listingRegistry{etags: true},
			tags:          []string{"10", "9"},
			want:          []string{"10", "9"},
			wantETag:      true,
			wantUnchanged: true,
		},
		{
			name:     "ETag: a changed listing is sent",
			registry: listingRegistry{etags: true},
			tags:     []string{"10"},
			then:     "11",
			want:     []string{"10"},
			wantETag: true,
		},
		{
			name:     "pages are followed; their ETags are not kept",
			registry: listingRegistry{pageSize: 2, etags: true},
			tags:     []string{"1", "2", "3", "4", "5"},
			want:     []string{"1", "2", "3", "4", "5"},
		},
		{
			name:     "a next page on another host is refused",
			registry: listingRegistry{pageSize: 1, foreignLink: true},
			tags:     []string{"1", "2"},
			bad:      "another host",
		},
		{
			name: "a repository that does not exist has no tags",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			host := startListingRegistry(t, &tt.registry)
			for _, tag := range tt.tags {
				pushRandom(t, host, "acme/rhel", tag)
			}
			var log requestLog
			c := testClient(t, WithRequestObserver(log.observe), WithRetry(1, time.Millisecond))
			repo, err := name.NewRepository(host + "/acme/rhel")
			if err != nil {
				t.Fatal(err)
			}
			tags, etag, unchanged, err := c.ListTags(t.Context(), repo, "")
			if tt.bad != "" {
				if err == nil || !strings.Contains(err.Error(), tt.bad) {
					t.Fatalf("error %v, want one saying %q", err, tt.bad)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			slices.Sort(tags)
			if unchanged || !slices.Equal(tags, tt.want) || (etag != "") != tt.wantETag {
				t.Fatalf("listed %q, ETag %q, not modified %v; want %q, an ETag: %v", tags, etag, unchanged, tt.want, tt.wantETag)
			}
			if etag == "" {
				return
			}
			if tt.then != "" {
				pushRandom(t, host, "acme/rhel", tt.then)
			}
			log.take()
			tags, etag2, unchanged, err := c.ListTags(t.Context(), repo, etag)
			if err != nil {
				t.Fatal(err)
			}
			if got := log.take(); len(got) != 1 {
				t.Errorf("the conditional listing took %d requests: %v", len(got), got)
			}
			if unchanged != tt.wantUnchanged {
				t.Fatalf("not modified: %v, want %v", unchanged, tt.wantUnchanged)
			}
			if unchanged {
				if tags != nil || etag2 != etag {
					t.Errorf("a 304 returned tags %q and ETag %q, want none and %q", tags, etag2, etag)
				}
				return
			}
			if !slices.Contains(tags, tt.then) || etag2 == etag || etag2 == "" {
				t.Errorf("after pushing %s: listed %q with ETag %q (was %q)", tt.then, tags, etag2, etag)
			}
		})
	}
}

// TestListTagsLimits: a registry's listing is bounded before it is read; a
// well-formed page one byte over the limit is refused.
func TestListTagsLimits(t *testing.T) {
	huge := []byte(`{"tags":["` + strings.Repeat("a", maxTagPageBytes-len(`{"tags":[""]}`)+1) + `"]}`)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v2/" {
			return
		}
		w.Write(huge)
	}))
	t.Cleanup(srv.Close)
	c := testClient(t, WithRetry(1, time.Millisecond))
	repo, err := name.NewRepository(strings.TrimPrefix(srv.URL, "http://") + "/acme/rhel")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := c.ListTags(t.Context(), repo, ""); err == nil || !strings.Contains(err.Error(), "over the limit of 16 MiB") {
		t.Errorf("a listing over the size limit: %v, want refused for its size", err)
	}
}

// TestListTagsFollowsAtMostMaxTagPages: a registry whose tag listing links
// page after page is followed for maxTagPages pages and no further; a
// listing of exactly that many pages is read whole, one of a page more is
// refused, naming the bound, without asking for the page past it.
func TestListTagsFollowsAtMostMaxTagPages(t *testing.T) {
	for _, tc := range []struct {
		name  string
		pages int
		bad   bool
	}{
		{"as many pages as the bound", maxTagPages, false},
		{"a page more than the bound", maxTagPages + 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			asked := 0
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/v2/" {
					return
				}
				page, _ := strconv.Atoi(r.URL.Query().Get("page"))
				mu.Lock()
				asked++
				mu.Unlock()
				if page+1 < tc.pages {
					w.Header().Set("Link", fmt.Sprintf(`</v2/acme/rhel/tags/list?page=%d>; rel="next"`, page+1))
				}
				fmt.Fprintf(w, `{"name":"acme/rhel","tags":["t%d"]}`, page)
			}))
			t.Cleanup(srv.Close)
			c := testClient(t, WithRetry(1, time.Millisecond))
			repo, err := name.NewRepository(strings.TrimPrefix(srv.URL, "http://") + "/acme/rhel")
			if err != nil {
				t.Fatal(err)
			}
			tags, _, _, err := c.ListTags(t.Context(), repo, "")
			mu.Lock()
			n := asked
			mu.Unlock()
			if tc.bad {
				if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("more than %d pages", maxTagPages)) {
					t.Errorf("a listing of %d pages: %d tags, error %v; want refused for its pages", tc.pages, len(tags), err)
				}
				if n != maxTagPages {
					t.Errorf("%d pages asked for, want %d", n, maxTagPages)
				}
				return
			}
			if err != nil || len(tags) != tc.pages || tags[0] != "t0" || tags[len(tags)-1] != fmt.Sprintf("t%d", tc.pages-1) {
				t.Errorf("a listing of %d pages: %d tags, error %v; want every page's tag", tc.pages, len(tags), err)
			}
		})
	}
}
