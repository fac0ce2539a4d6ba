package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"golang.org/x/sync/errgroup"

	"github.com/imagepipe/imagepipe/pkg/api"
)

// Limits on a tag listing, which comes from the registry and is not
// trusted: the bytes of one page and the number of pages followed.
const (
	maxTagPageBytes = 16 << 20
	maxTagPages     = 10000
)

// Repositories lists every repository of a registry (the catalog, all
// pages): one request per page on a kept session (see ListTags).
func (c *Client) Repositories(ctx context.Context, reg name.Registry) ([]string, error) {
	ropts, err := c.sessionOptions(ctx, reg)
	if err != nil {
		return nil, err
	}
	repos, err := remote.Catalog(ctx, reg, ropts...)
	if err != nil {
		return nil, fmt.Errorf("listing the repositories of %s: %w", reg, err)
	}
	return repos, nil
}

// ListTags lists the tags of repo, all pages, build-key tags excluded,
// conditionally: when etag is not "" it is sent as If-None-Match, and the
// registry's 304 answer returns notModified and no tags. newETag is the
// listing's ETag to pass next time; it is "" when the registry sends none
// (the CNCF distribution registry sends none on tag listings) or when the
// listing spans pages, as the first page's ETag says nothing of the
// others. A repository that does not exist has no tags.
//
// Calls share an authenticated session per registry, kept for a few
// minutes, so a listing of one page costs one request, plus a GET /v2/
// and a token exchange when the session is opened or renewed. On a
// registry that issues tokens, the session's first request to each
// repository is also challenged once (a 401, a token for the added scope,
// the request again), and so is the first after the token expires.
func (c *Client) ListTags(ctx context.Context, repo name.Repository, etag string) (tags []string, newETag string, notModified bool, err error) {
	rt, err := c.session(ctx, repo.Registry)
	if err != nil {
		return nil, "", false, err
	}
	client := &http.Client{Transport: rt}
	next := &url.URL{Scheme: repo.Scheme(), Host: repo.RegistryStr(), Path: "/v2/" + repo.RepositoryStr() + "/tags/list"}
	for page := 0; next != nil; page++ {
		if page == maxTagPages {
			return nil, "", false, fmt.Errorf("listing the tags of %s: more than %d pages", repo, maxTagPages)
		}
		var pageTags []string
		var pageETag string
		pageTags, pageETag, next, notModified, err = listTagsPage(ctx, client, repo, next, etag)
		if err != nil {
			if page == 0 && isNotFound(err) {
				return nil, "", false, nil
			}
			return nil, "", false, fmt.Errorf("listing the tags of %s: %w", repo, err)
		}
		if notModified {
			return nil, etag, true, nil
		}
		if page == 0 && next == nil {
			newETag = pageETag
		}
		tags = append(tags, pageTags...)
		etag = "" // only the first page is asked conditionally
	}
	return slices.DeleteFunc(tags, api.IsAttachmentTag), newETag, false, nil
}

// listTagsPage fetches one page of a tag listing: its tags, its ETag, and
// the next page from the Link header (nil on the last page), which must be
// on the same registry.
func listTagsPage(ctx context.Context, client *http.Client, repo name.Repository, u *url.URL, etag string) (tags []string, pageETag string, next *url.URL, notModified bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, "", nil, false, err
	}
	if etag != "" {
		req.Header.Set("If-None-Match", etag)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, "", nil, false, err
	}
	defer resp.Body.Close()
	if etag != "" && resp.StatusCode == http.StatusNotModified {
		return nil, "", nil, true, nil
	}
	if err := transport.CheckError(resp, http.StatusOK); err != nil {
		return nil, "", nil, false, err
	}
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxTagPageBytes+1))
	if err != nil {
		return nil, "", nil, false, fmt.Errorf("reading the tag listing: %w", err)
	}
	if len(raw) > maxTagPageBytes {
		return nil, "", nil, false, fmt.Errorf("a page of the tag listing of %s is over the limit of %d MiB", repo, maxTagPageBytes>>20)
	}
	var body struct {
		Tags []string `json:"tags"`
	}
	if err := json.Unmarshal(raw, &body); err != nil {
		return nil, "", nil, false, fmt.Errorf("reading the tag listing: %w", err)
	}
	next, err = nextPage(resp, repo.Registry)
	if err != nil {
		return nil, "", nil, false, err
	}
	return body.Tags, resp.Header.Get("ETag"), next, false, nil
}

// nextPage reads an RFC 5988 Link header (`<URL>; rel="next"`), resolved
// against the request; nil when there is none. A link to another host is
// refused: a registry does not get to send the client elsewhere.
func nextPage(resp *http.Response, reg name.Registry) (*url.URL, error) {
	link := resp.Header.Get("Link")
	if link == "" {
		return nil, nil
	}
	start, end := strings.IndexByte(link, '<'), strings.IndexByte(link, '>')
	if start != 0 || end < 1 {
		return nil, fmt.Errorf("malformed Link header %q", link)
	}
	if end == 1 {
		return nil, nil
	}
	u, err := url.Parse(link[1:end])
	if err != nil {
		return nil, fmt.Errorf("malformed Link header %q: %w", link, err)
	}
	u = resp.Request.URL.ResolveReference(u)
	if u.Host != reg.RegistryStr() {
		return nil, errors.New("the next page of the tag listing is on another host")
	}
	return u, nil
}

// tagDigests returns every tag of repo (build-key tags excluded) with the
// digest it points at: one listing and one HEAD per tag.
func (c *Client) tagDigests(ctx context.Context, repo name.Repository) (map[string]string, error) {
	ropts, err := c.remoteOptions(ctx, repo.Registry)
	if err != nil {
		return nil, err
	}
	tags, err := listTags(repo, ropts)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(tags))
	var mu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(listConcurrency)
	ropts, err = c.remoteOptions(gctx, repo.Registry)
	if err != nil {
		return nil, err
	}
	for _, tag := range tags {
		g.Go(func() error {
			desc, err := remote.Head(repo.Tag(tag), ropts...)
			if isNotFound(err) {
				return nil // deleted between the listing and now
			}
			if err != nil {
				return fmt.Errorf("resolving %s:%s: %w", repo, tag, err)
			}
			mu.Lock()
			out[tag] = desc.Digest.String()
			mu.Unlock()
			return nil
		})
	}
	return out, g.Wait()
}

// Resolve looks a tag up directly with one HEAD on a kept session (see
// ListTags). found is false only when the registry answered that the tag
// does not exist; any other failure is an error.
//
// A 404 alone is not that answer: an ingress's default backend or a proxy
// in front of the registry answers 404 too. A HEAD answer has no body, so a
// 404 is asked again with a GET of the manifest, and only a 404 whose body
// is the OCI distribution error for an unknown manifest or repository
// (MANIFEST_UNKNOWN or NAME_UNKNOWN, as distribution, zot and Quay send,
// or Harbor's NOT_FOUND) confirms that the tag is gone.
func (c *Client) Resolve(ctx context.Context, ref name.Tag) (digest string, found bool, err error) {
	ropts, err := c.sessionOptions(ctx, ref.Registry)
	if err != nil {
		return "", false, err
	}
	desc, err := remote.Head(ref, ropts...)
	if isNotFound(err) {
		return confirmAbsent(ref, ropts)
	}
	if err != nil {
		return "", false, fmt.Errorf("resolving %s: %w", ref, err)
	}
	return desc.Digest.String(), true, nil
}

// confirmAbsent asks for ref's manifest after a HEAD answered 404; see
// Resolve. The tag may also have been pushed again meanwhile.
func confirmAbsent(ref name.Tag, ropts []remote.Option) (string, bool, error) {
	desc, err := remote.Get(ref, ropts...)
	if err == nil {
		return desc.Digest.String(), true, nil
	}
	var terr *transport.Error
	if !errors.As(err, &terr) || terr.StatusCode != http.StatusNotFound {
		return "", false, fmt.Errorf("resolving %s: %w", ref, err)
	}
	for _, d := range terr.Errors {
		switch d.Code {
		case transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode, harborNotFound:
			return "", false, nil
		}
	}
	return "", false, fmt.Errorf("resolving %s: %w: the 404 carries no OCI error naming an unknown manifest or repository, so it may not come from the registry (a proxy or ingress default backend?)", ref, ErrNotRegistry)
}

// harborNotFound is the error code Harbor answers for an unknown artifact.
const harborNotFound transport.ErrorCode = "NOT_FOUND"

// ErrNotRegistry is returned (wrapped) when a "not found" answer does not
// prove that the registry gave it.
var ErrNotRegistry = errors.New("404 without a registry error body")

// listConcurrency is how many requests tagDigests has in flight at once.
const listConcurrency = 8

// listTags lists a repository's tags without the build-key tags. A
// repository the catalog still names but that holds no tag has none.
func listTags(repo name.Repository, ropts []remote.Option) ([]string, error) {
	all, err := remote.List(repo, ropts...)
	if isNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing the tags of %s: %w", repo, err)
	}
	return slices.DeleteFunc(all, api.IsAttachmentTag), nil
}

// isNotFound reports a registry's 404 answer.
func isNotFound(err error) bool {
	var terr *transport.Error
	return errors.As(err, &terr) && terr.StatusCode == http.StatusNotFound
}
