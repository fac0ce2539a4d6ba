package registry

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// referrersProbe sees every request of a session and calls missing when
// the registry answers a referrers API request with 404: it has no such
// API, and the OCI distribution specification's fallback, the referrers
// tag, lists the referrers instead.
type referrersProbe struct {
	next    http.RoundTripper
	missing func()
}

func (p referrersProbe) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := p.next.RoundTrip(req)
	if err == nil && resp.StatusCode == http.StatusNotFound && req.Method == http.MethodGet && strings.Contains(req.URL.Path, "/referrers/sha256:") {
		p.missing()
	}
	return resp, err
}

func (c *Client) markNoReferrersAPI(host string) {
	c.mu.Lock()
	c.noReferrersAPI[host] = true
	c.mu.Unlock()
}

func (c *Client) lacksReferrersAPI(host string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.noReferrersAPI[host]
}

// referrersTag lists subject's referrers of artifactType ("" for all)
// from its referrers tag ("sha256-HEX"); a tag that does not exist lists
// none.
func referrersTag(subject name.Digest, artifactType string, ropts []remote.Option) ([]v1.Descriptor, error) {
	tag := subject.Context().Tag(strings.Replace(subject.DigestStr(), ":", "-", 1))
	desc, err := remote.Get(tag, ropts...)
	var terr *transport.Error
	if errors.As(err, &terr) && terr.StatusCode == http.StatusNotFound {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing the referrers of %s: %w", subject, err)
	}
	idx, err := desc.ImageIndex()
	if err != nil {
		return nil, fmt.Errorf("listing the referrers of %s: the referrers tag is not an index: %w", subject, err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("listing the referrers of %s: %w", subject, err)
	}
	var out []v1.Descriptor
	for _, d := range m.Manifests {
		if artifactType == "" || d.ArtifactType == artifactType {
			out = append(out, d)
		}
	}
	return out, nil
}
