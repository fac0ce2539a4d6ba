package intake

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/imagepipe/imagepipe/internal/imageref"
)

// MaxWebhookBody is the largest webhook body accepted: 1 MiB. Registries
// batch events; distribution's default batch is far smaller.
const MaxWebhookBody = 1 << 20

// MaxEventsPerBody bounds the events one body may carry.
const MaxEventsPerBody = 1000

// Action is what happened to an image.
type Action string

// Actions the syncer acts on; pulls and blob events are ignored.
const (
	ActionPush   Action = "push"
	ActionDelete Action = "delete"
)

// Event is one image change a registry announced.
type Event struct {
	// Action is push or delete.
	Action Action
	// Repository is the repository path without the registry host, e.g. "acme/rhel".
	Repository string
	// Tag is the tag, when the registry named one.
	Tag string
	// Digest is the manifest digest, when the registry gave one (Quay does not).
	Digest string
	// Source names the payload format: distribution, harbor, quay or zot.
	Source string
}

// ErrMalformed is returned (wrapped) for a body that is not a valid
// notification; the handler answers 400.
var ErrMalformed = errors.New("malformed webhook body")

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
}

// validate checks the names in e; a registry is not trusted to send valid ones.
func (e Event) validate() error {
	switch {
	case imageref.CheckRepository(e.Repository) != nil:
		return malformed("invalid repository %q", e.Repository)
	case e.Tag != "" && imageref.CheckTag(e.Tag) != nil:
		return malformed("invalid tag %q", e.Tag)
	case e.Digest != "" && imageref.CheckDigest(e.Digest) != nil:
		return malformed("invalid digest %q", e.Digest)
	case e.Tag == "" && e.Digest == "":
		return malformed("event for %s names neither a tag nor a digest", e.Repository)
	}
	return nil
}

// ParseWebhook turns a webhook body into events. The format is recognised
// from the Content-Type and CloudEvents headers and the body's shape:
// distribution notifications (an "events" envelope), Harbor's default JSON,
// the CloudEvents of Harbor and zot (structured or binary), and Quay's
// repo_push. Events the syncer has no use for (pulls, blobs, other Harbor or
// zot event types) are dropped; an invalid body is an ErrMalformed error.
func ParseWebhook(header http.Header, body []byte) ([]Event, error) {
	if len(body) > MaxWebhookBody {
		return nil, malformed("body of %d bytes exceeds %d", len(body), MaxWebhookBody)
	}
	if ceType := header.Get("Ce-Type"); ceType != "" { // binary CloudEvent
		return parseCloudEvent(ceType, body)
	}
	body = bytes.TrimSpace(body)
	if len(body) == 0 || body[0] != '{' {
		return nil, malformed("not a JSON object")
	}
	var probe struct {
		Events      json.RawMessage `json:"events"`
		SpecVersion string          `json:"specversion"`
		Type        string          `json:"type"`
		Data        json.RawMessage `json:"data"`
		EventData   json.RawMessage `json:"event_data"`
		UpdatedTags json.RawMessage `json:"updated_tags"`
	}
	if err := json.Unmarshal(body, &probe); err != nil {
		return nil, malformed("%v", err)
	}
	switch {
	case probe.Events != nil:
		return parseDistribution(probe.Events)
	case probe.SpecVersion != "":
		return parseCloudEvent(probe.Type, probe.Data)
	case probe.EventData != nil:
		return parseHarbor(probe.Type, probe.EventData)
	case probe.UpdatedTags != nil:
		return parseQuay(body)
	}
	return nil, malformed("unknown notification format")
}

// distribution notifications: {"events": [{"action", "target": {...}}]}.
func parseDistribution(raw json.RawMessage) ([]Event, error) {
	var events []struct {
		Action string `json:"action"`
		Target struct {
			MediaType  string `json:"mediaType"`
			Digest     string `json:"digest"`
			Repository string `json:"repository"`
			Tag        string `json:"tag"`
		} `json:"target"`
	}
	if err := json.Unmarshal(raw, &events); err != nil {
		return nil, malformed("events: %v", err)
	}
	if len(events) > MaxEventsPerBody {
		return nil, malformed("%d events in one body, over %d", len(events), MaxEventsPerBody)
	}
	var out []Event
	for _, ev := range events {
		var action Action
		switch ev.Action {
		case "push":
			if !isManifestType(ev.Target.MediaType) {
				continue // a blob
			}
			action = ActionPush
		case "delete":
			action = ActionDelete
		default:
			continue // pull, mount
		}
		e := Event{Action: action, Repository: ev.Target.Repository, Tag: ev.Target.Tag, Digest: ev.Target.Digest, Source: "distribution"}
		if err := e.validate(); err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
}

// isManifestType reports manifest and index media types, whose pushes are
// images; blob pushes carry layer or config types.
func isManifestType(mt string) bool {
	return strings.Contains(mt, "manifest") || strings.HasSuffix(mt, "image.index.v1+json")
}

// harborData is Harbor's event_data, also the data of its CloudEvents.
type harborData struct {
	Resources []struct {
		Digest string `json:"digest"`
		Tag    string `json:"tag"`
	} `json:"resources"`
	Repository struct {
		RepoFullName string `json:"repo_full_name"`
	} `json:"repository"`
}

// parseHarbor reads Harbor's default payload (type PUSH_ARTIFACT or
// DELETE_ARTIFACT with event_data).
func parseHarbor(typ string, raw json.RawMessage) ([]Event, error) {
	var action Action
	switch typ {
	case "PUSH_ARTIFACT":
		action = ActionPush
	case "DELETE_ARTIFACT":
		action = ActionDelete
	default:
		return nil, nil
	}
	return harborEvents(action, raw)
}

func harborEvents(action Action, raw json.RawMessage) ([]Event, error) {
	var d harborData
	if err := json.Unmarshal(raw, &d); err != nil {
		return nil, malformed("harbor event data: %v", err)
	}
	if len(d.Resources) > MaxEventsPerBody {
		return nil, malformed("%d resources in one event", len(d.Resources))
	}
	var out []Event
	for _, r := range d.Resources {
		e := Event{Action: action, Repository: d.Repository.RepoFullName, Tag: r.Tag, Digest: r.Digest, Source: "harbor"}
		if strings.HasPrefix(r.Tag, "sha256:") { // an untagged artifact: Harbor names it by digest
			e.Tag = ""
			if e.Digest == "" {
				e.Digest = r.Tag
			}
		}
		if err := e.validate(); err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
}

// CloudEvent types the syncer acts on. Any other type is dropped.
const (
	ceHarborPushed  = "harbor.artifact.pushed"
	ceHarborDeleted = "harbor.artifact.deleted"
	ceZotUpdated    = "zotregistry.image.updated"
	ceZotDeleted    = "zotregistry.image.deleted"
)

// parseCloudEvent reads the data of a CloudEvent, from the body of a binary
// one (type in the Ce-Type header) or the "data" member of a structured one.
// Harbor's harbor.artifact.pushed/deleted and zot's
// zotregistry.image.updated/deleted are images pushed or deleted; other
// types (zot's zotregistry.repository.created, image.lint_failed and
// image.scanned, Harbor's pulls and scans) are ignored.
func parseCloudEvent(typ string, data json.RawMessage) ([]Event, error) {
	switch typ {
	case ceHarborPushed:
		return harborEvents(ActionPush, data)
	case ceHarborDeleted:
		return harborEvents(ActionDelete, data)
	case ceZotUpdated:
		return zotEvents(ActionPush, data)
	case ceZotDeleted:
		return zotEvents(ActionDelete, data)
	}
	return nil, nil
}

// zotData is the data of zot's image CloudEvents, a JSON object
// {"name", "reference", "digest", "mediaType", "manifest" (the manifest as a
// string, updates only), "actor", "request"}. The reference is the tag, or
// the digest for a push or delete by digest. zot's HTTP sink sends events
// with the CloudEvents Go SDK in binary mode: ce-* headers (source
// "zotregistry.dev") and the data as an application/json body.
//
// Verified against project-zot/zot's zotregistry.dev/zot/v2 sources, the
// release line whose "Event Support" docs (v2.1.21) add typePrefix:
// pkg/extensions/events/common.go (type constants, Identity),
// events.go (eventRecorder.ImageUpdated, ImageDeleted), builder.go and
// http_sink.go. The data fields are the same in the earlier
// zotregistry.dev/zot releases that first shipped events.
//
// Only zot's default type prefix "zotregistry" is recognised: a zot
// configured with its own "typePrefix" sends types this parser drops, and
// polling alone keeps its images current.
type zotData struct {
	Name      string `json:"name"`
	Reference string `json:"reference"`
	Digest    string `json:"digest"`
}

// zotEvents reads the data of one zot image event.
func zotEvents(action Action, raw json.RawMessage) ([]Event, error) {
	var d zotData
	if err := json.Unmarshal(raw, &d); err != nil {
		return nil, malformed("zot event data: %v", err)
	}
	e := Event{Action: action, Repository: d.Name, Tag: d.Reference, Digest: d.Digest, Source: "zot"}
	if strings.Contains(d.Reference, ":") { // a digest: a tag cannot hold ':'
		e.Tag = ""
		if e.Digest == "" {
			e.Digest = d.Reference
		}
	}
	if err := e.validate(); err != nil {
		return nil, err
	}
	return []Event{e}, nil
}

// parseQuay reads Quay's repo_push: a repository and its updated tags, with
// no digests; the syncer resolves each tag.
func parseQuay(body []byte) ([]Event, error) {
	var q struct {
		Repository  string   `json:"repository"`
		UpdatedTags []string `json:"updated_tags"`
	}
	if err := json.Unmarshal(body, &q); err != nil {
		return nil, malformed("quay: %v", err)
	}
	if len(q.UpdatedTags) > MaxEventsPerBody {
		return nil, malformed("%d updated tags in one body", len(q.UpdatedTags))
	}
	var out []Event
	for _, tag := range q.UpdatedTags {
		e := Event{Action: ActionPush, Repository: q.Repository, Tag: tag, Source: "quay"}
		if err := e.validate(); err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
}
