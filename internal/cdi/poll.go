package cdi

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/go-containerregistry/pkg/name"
)

// TagRegistry is what polling needs from the central registry;
// *registry.Client implements it.
type TagRegistry interface {
	Repositories(ctx context.Context, reg name.Registry) ([]string, error)
	TagDigests(ctx context.Context, repo name.Repository) (map[string]string, error)
	Resolve(ctx context.Context, ref name.Tag) (digest string, found bool, err error)
}

// Poller finds changes by listing the registry, catching what webhooks
// missed (distribution drops queued notifications when it restarts).
//
// It never deletes because of silence: a failed listing keeps everything
// it knew, and a tag missing from a successful listing becomes a delete
// event only after a direct look-up answers that it does not exist.
type Poller struct {
	reg     name.Registry
	client  TagRegistry
	tenancy *Tenancy
	known   map[string]map[string]string // repository → tag → digest
}

// NewPoller polls reg for the tenants tenancy serves.
func NewPoller(reg name.Registry, client TagRegistry, tenancy *Tenancy) *Poller {
	return &Poller{reg: reg, client: client, tenancy: tenancy, known: map[string]map[string]string{}}
}

// Poll lists the registry once and returns what changed since the last
// poll: pushes for new tags and moved digests, deletes for tags confirmed
// gone. Errors for single repositories are joined into the returned error;
// the events found elsewhere are still returned.
func (p *Poller) Poll(ctx context.Context) ([]Event, error) {
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
		tags, err := p.client.TagDigests(ctx, p.reg.Repo(repo))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		ev, err := p.compare(ctx, repo, tags)
		events = append(events, ev...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	// A repository that left the catalog: every tag must be confirmed gone.
	for repo := range p.known {
		if !listed[repo] {
			ev, err := p.compare(ctx, repo, map[string]string{})
			events = append(events, ev...)
			if err != nil {
				errs = append(errs, err)
			}
		}
	}
	return events, errors.Join(errs...)
}

// compare turns one repository's listing into events and updates what is known.
func (p *Poller) compare(ctx context.Context, repo string, tags map[string]string) ([]Event, error) {
	var events []Event
	var errs []error
	before := p.known[repo]
	now := map[string]string{}
	for tag, digest := range tags {
		now[tag] = digest
		if before[tag] != digest {
			events = append(events, Event{Action: ActionPush, Repository: repo, Tag: tag, Digest: digest, Source: "poll"})
		}
	}
	for tag, digest := range before {
		if _, ok := tags[tag]; ok {
			continue
		}
		got, found, err := p.client.Resolve(ctx, p.reg.Repo(repo).Tag(tag))
		switch {
		case err != nil:
			errs = append(errs, err)
			now[tag] = digest // unsure: keep it
		case found:
			now[tag] = got // the listing was stale
			if got != digest {
				events = append(events, Event{Action: ActionPush, Repository: repo, Tag: tag, Digest: got, Source: "poll"})
			}
		default:
			events = append(events, Event{Action: ActionDelete, Repository: repo, Tag: tag, Digest: digest, Source: "poll"})
		}
	}
	if len(now) == 0 {
		delete(p.known, repo)
	} else {
		p.known[repo] = now
	}
	return events, errors.Join(errs...)
}
