package intake

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/google/go-containerregistry/pkg/name"
	"golang.org/x/sync/errgroup"
)

// TagRegistry is what polling needs from the central registry;
// *registry.Client implements it.
type TagRegistry interface {
	// Repositories lists the registry's catalog, all pages.
	Repositories(ctx context.Context, reg name.Registry) ([]string, error)
	// ListTags lists a repository's tags, sending etag as If-None-Match
	// when it is not "": notModified reports the registry's 304. newETag
	// is "" when the registry offers none for the listing.
	ListTags(ctx context.Context, repo name.Repository, etag string) (tags []string, newETag string, notModified bool, err error)
	// Resolve looks a tag up; found is false only when the registry
	// answered that it does not exist.
	Resolve(ctx context.Context, ref name.Tag) (digest string, found bool, err error)
}

// Tenants decides which repositories this hub serves; the hub's Tenancy
// implements it. Namespace fails for a repository whose tenant is not
// served here or whose name is invalid.
type Tenants interface {
	Namespace(repository string) (tenant, namespace string, err error)
}

// resolveConcurrency is how many tag look-ups a poll has in flight at once.
const resolveConcurrency = 8

// Poller finds changes by listing the registry, catching what webhooks
// missed (distribution drops queued notifications when it restarts).
//
// A pass comes in two kinds. Poll, the fast pass, reads the catalog and
// lists each served repository's tags, conditionally where the registry
// gives the listing an ETag; it looks up only tags that are new since the
// last pass and tags that left the listing. With nothing changed it costs
// one request per catalog page and one per repository. It cannot see a tag
// pushed again to a new digest, which leaves the listing as it was.
// PollDigests, the full pass, also looks up every known tag's digest, one
// request per tag, and so catches those. The caller decides how often each
// runs; the first pass of a Poller learns every digest either way.
//
// Neither deletes because of silence: a failed listing keeps everything
// it knew, and a tag missing from a successful listing becomes a delete
// event only after a direct look-up answers that it does not exist.
//
// A Poller is not safe for concurrent use; passes run one at a time.
type Poller struct {
	reg     name.Registry
	client  TagRegistry
	tenancy Tenants
	known   map[string]*repoState // by repository
}

// repoState is what a Poller knows of one repository.
type repoState struct {
	digests map[string]string // tag → digest
	etag    string            // of the last listing fully taken in; "" for none
}

// NewPoller polls reg for the tenants tenancy serves.
func NewPoller(reg name.Registry, client TagRegistry, tenancy Tenants) *Poller {
	return &Poller{reg: reg, client: client, tenancy: tenancy, known: map[string]*repoState{}}
}

// Poll runs a fast pass and returns what changed since the last pass:
// pushes for new tags and for tags a look-up found at a new digest,
// deletes for tags confirmed gone. Errors for single repositories
// are joined into the returned error; the events found elsewhere are still
// returned.
func (p *Poller) Poll(ctx context.Context) ([]Event, error) {
	return p.pass(ctx, false)
}

// PollDigests runs a full pass: a fast pass that also looks up the digest
// of every tag, to find tags pushed again whose webhook was missed. Its
// results and errors are those of Poll.
func (p *Poller) PollDigests(ctx context.Context) ([]Event, error) {
	return p.pass(ctx, true)
}

func (p *Poller) pass(ctx context.Context, full bool) ([]Event, error) {
	repos, err := p.client.Repositories(ctx, p.reg)
	if err != nil {
		return nil, fmt.Errorf("polling %s: %w", p.reg, err) // nothing is forgotten
	}
	listed := map[string]bool{}
	var events []Event
	var errs []error
	for _, repo := range repos {
		if _, _, err := p.tenancy.Namespace(repo); err != nil {
			continue // another hub's tenant, or an invalid name
		}
		listed[repo] = true
		st := p.known[repo]
		etag := ""
		if st != nil {
			etag = st.etag
		}
		tags, newETag, unchanged, err := p.client.ListTags(ctx, p.reg.Repo(repo), etag)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if unchanged {
			if !full || st == nil {
				continue
			}
			tags, newETag = slices.Collect(maps.Keys(st.digests)), etag
		}
		ev, err := p.compare(ctx, repo, tags, newETag, full)
		events = append(events, ev...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	// A repository that left the catalog: every tag must be confirmed gone.
	for _, repo := range slices.Sorted(maps.Keys(p.known)) {
		if !listed[repo] {
			ev, err := p.compare(ctx, repo, nil, "", full)
			events = append(events, ev...)
			if err != nil {
				errs = append(errs, err)
			}
		}
	}
	return events, errors.Join(errs...)
}

// lookup is the answer of one Resolve.
type lookup struct {
	tag, digest string
	found       bool
	err         error
}

// compare turns one repository's listing into events and updates what is
// known. It looks up tags new to the listing, tags gone from it, and, in a
// full pass, every listed tag. etag is kept only when every look-up
// answered, so that a tag that could not be looked up is listed, and
// tried, again on the next pass.
func (p *Poller) compare(ctx context.Context, repo string, tags []string, etag string, full bool) ([]Event, error) {
	var before map[string]string
	if st := p.known[repo]; st != nil {
		before = st.digests
	}
	now := map[string]string{}
	inListing := map[string]bool{}
	var ask []string
	for _, tag := range tags {
		if inListing[tag] {
			continue
		}
		inListing[tag] = true
		if d, ok := before[tag]; ok && !full {
			now[tag] = d
			continue
		}
		ask = append(ask, tag)
	}
	for tag := range before {
		if !inListing[tag] {
			ask = append(ask, tag)
		}
	}
	slices.Sort(ask)

	answers := make([]lookup, len(ask))
	var g errgroup.Group
	g.SetLimit(resolveConcurrency)
	for i, tag := range ask {
		g.Go(func() error {
			d, found, err := p.client.Resolve(ctx, p.reg.Repo(repo).Tag(tag))
			answers[i] = lookup{tag: tag, digest: d, found: found, err: err}
			return nil // each look-up's error is its own answer
		})
	}
	_ = g.Wait()

	var events []Event
	var errs []error
	for _, a := range answers {
		old, wasKnown := before[a.tag]
		switch {
		case a.err != nil:
			errs = append(errs, a.err)
			if wasKnown {
				now[a.tag] = old // unsure: keep it
			}
		case a.found:
			now[a.tag] = a.digest // a listing that left it out was stale
			if a.digest != old {
				events = append(events, Event{Action: ActionPush, Repository: repo, Tag: a.tag, Digest: a.digest, Source: "poll"})
			}
		case wasKnown: // the registry answered that it does not exist
			events = append(events, Event{Action: ActionDelete, Repository: repo, Tag: a.tag, Digest: old, Source: "poll"})
		}
	}
	if len(errs) > 0 {
		etag = ""
	}
	if len(now) == 0 {
		delete(p.known, repo)
	} else {
		p.known[repo] = &repoState{digests: now, etag: etag}
	}
	return events, errors.Join(errs...)
}
