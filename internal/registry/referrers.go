package registry

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// referrersProbe sees every request of a session and calls missing with
// "HOST/REPOSITORY" when the registry answers a referrers API request of
// that repository with 404. Such a registry has no referrers API, and the
// OCI distribution specification's fallback, the referrers tag, lists the
// referrers instead; or it does not hold the repository (zot answers so,
// with an empty body). Either way the referrers tag says as much, so the
// answer is kept for the repository alone.
type referrersProbe struct {
	next    http.RoundTripper
	missing func(repo string)
}

func (p referrersProbe) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := p.next.RoundTrip(req)
	if err == nil && resp.StatusCode == http.StatusNotFound && req.Method == http.MethodGet {
		if repo, _, ok := strings.Cut(strings.TrimPrefix(req.URL.Path, "/v2/"), "/referrers/sha256:"); ok {
			p.missing(req.URL.Host + "/" + repo)
		}
	}
	return resp, err
}

// noReferrersAPITTL is how long a repository is taken to lack the
// referrers API after its registry answered so; then the API is asked
// again (the registry may have been upgraded, the repository pushed).
const noReferrersAPITTL = 10 * time.Minute

func (c *Client) markNoReferrersAPI(repo string) {
	c.mu.Lock()
	c.noReferrersAPI[repo] = time.Now()
	c.mu.Unlock()
}

func (c *Client) lacksReferrersAPI(repo string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	at, ok := c.noReferrersAPI[repo]
	if ok && time.Since(at) >= noReferrersAPITTL {
		delete(c.noReferrersAPI, repo) // the record lasts as long as it holds
		ok = false
	}
	return ok
}

// referrersTag lists subject's referrers of artifactType ("" for all)
// from its referrers tag ("sha256-HEX"), with the digest of the index the
// tag points at; a tag that does not exist lists none, at digest "".
func referrersTag(subject name.Digest, artifactType string, ropts []remote.Option) ([]v1.Descriptor, string, error) {
	tag := subject.Context().Tag(strings.Replace(subject.DigestStr(), ":", "-", 1))
	desc, err := remote.Get(tag, ropts...)
	var terr *transport.Error
	if errors.As(err, &terr) && terr.StatusCode == http.StatusNotFound {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("listing the referrers of %s: %w", subject, err)
	}
	idx, err := desc.ImageIndex()
	if err != nil {
		return nil, "", fmt.Errorf("listing the referrers of %s: the referrers tag is not an index: %w", subject, err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, "", fmt.Errorf("listing the referrers of %s: %w", subject, err)
	}
	var out []v1.Descriptor
	for _, d := range m.Manifests {
		if artifactType == "" || d.ArtifactType == artifactType {
			out = append(out, d)
		}
	}
	return out, desc.Digest.String(), nil
}
