package imageref_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/imagepipe/imagepipe/internal/hub"
	"github.com/imagepipe/imagepipe/internal/imageref"
	"github.com/imagepipe/imagepipe/internal/intake"
	"github.com/imagepipe/imagepipe/internal/vmlaunch"
)

// answer is what an entry point makes of "TENANT/NAME:TAG": the tenant
// it attributes the image to, or "" for a refusal.
type answer struct{ tenant, repository string }

// entryPoints are the ways a name reaches imagepipe, each asked the same
// question: imagectl (a reference on the command line), the webhook
// intake (a registry's event), a hub (the namespace of a repository) and
// vmlaunch (an image named on the hub). The gate takes its tenants from
// the intake's events through imageref.Tenant. No tenant has a private
// network's namespace form (HOME-net-NAME), at any entry point.
var entryPoints = map[string]func(repository, tag string) answer{
	"imagectl": func(repository, tag string) answer {
		r, err := imageref.Parse("registry.example.com/"+repository+":"+tag, imageref.FormTag)
		if err != nil {
			return answer{}
		}
		tenant, err := r.Tenant()
		if err != nil {
			return answer{}
		}
		return answer{tenant, r.Repository}
	},
	"intake": func(repository, tag string) answer {
		body, _ := json.Marshal(map[string]any{"events": []any{map[string]any{
			"action": "push", "target": map[string]any{"repository": repository, "tag": tag, "digest": "sha256:" + strings.Repeat("a", 64),
				"mediaType": "application/vnd.oci.image.manifest.v1+json"}}}})
		events, err := intake.ParseWebhook(http.Header{"Content-Type": {"application/json"}}, body)
		if err != nil || len(events) != 1 {
			return answer{}
		}
		tenant, err := imageref.Tenant(events[0].Repository)
		if err != nil {
			return answer{}
		}
		return answer{tenant, events[0].Repository}
	},
	"hub": func(repository, tag string) answer {
		if imageref.CheckTag(tag) != nil { // a hub reads tags from events and listings
			return answer{}
		}
		tn, err := hub.NewTenancy(hub.DefaultNamespaceTemplate, nil, nil)
		if err != nil {
			panic(err)
		}
		tenant, ns, err := tn.Namespace(repository)
		if err != nil || ns != tenant {
			return answer{}
		}
		return answer{tenant, repository}
	},
	"vmlaunch": func(repository, tag string) answer {
		tenant, repo, gotTag, err := vmlaunch.ParseImageRef(repository + ":" + tag)
		if err != nil || gotTag != tag {
			return answer{}
		}
		return answer{tenant, repo}
	},
}

// TestEveryEntryPointReadsNamesAlike feeds the same names to every entry
// point and holds their answers equal: one tenant rule, one grammar.
func TestEveryEntryPointReadsNamesAlike(t *testing.T) {
	long := strings.Repeat("a", 63)
	cases := []struct {
		repository, tag string
		tenant          string // "" when every entry point must refuse
	}{
		{"acme/rhel", "10", "acme"},
		{"acme/team/rhel", "v1.2_3", "acme"},
		{"acme-corp/rhel", "10", "acme-corp"},
		{"acme/rhel", "Latest", "acme"},                        // upper-case tags are in the grammar
		{"acm/rhel", "10", "acm"},                              // a tenant that is a prefix of another
		{long + "/" + strings.Repeat("b", 190), "1", long},     // 254 characters
		{long + "/" + strings.Repeat("b", 191), "1", long},     // 255 characters
		{long + "/" + strings.Repeat("b", 192), "1", ""},       // 256 characters
		{long + "a/rhel", "1", ""},                             // a tenant of 64 characters
		{"Acme/rhel", "10", ""},                                // upper case
		{"acme/Rhel", "10", ""},                                // upper case
		{"acme/../globex/rhel", "10", ""},                      // a relative step
		{"acme/./rhel", "10", ""},                              // a relative step
		{"acme//rhel", "10", ""},                               // an empty component
		{"rhel", "10", ""},                                     // no tenant
		{"a.b/rhel", "10", ""},                                 // a tenant outside DNS labels
		{"a_b/rhel", "10", ""},                                 // a tenant outside DNS labels
		{"a__b/rhel", "10", ""},                                // a tenant outside DNS labels
		{"-acme/rhel", "10", ""},                               // a tenant starting with '-'
		{"acme-/rhel", "10", ""},                               // a tenant ending with '-'
		{"acme/rhel", ".10", ""},                               // a tag starting with '.'
		{"acme/rhel", strings.Repeat("t", 129), ""},            // a tag of 129 characters
		{"acme/rhel", "sha256:" + strings.Repeat("a", 64), ""}, // a digest where the tag goes
		{"acme:5000/rhel", "10", ""},                           // a port where the tenant goes
		{"acme/rhel@sha256", "10", ""},                         // an '@'
		{"acme/rh el", "10", ""},                               // a space
		{"acme/rhel\x00", "10", ""},                            // a NUL
		{"globex-net-lab/rhel", "1", ""},                       // a private network's namespace
		{"net-lab/rhel", "1", "net-lab"},                       // no home before "-net-"
		{"a-net-b/rhel", "1", ""},                              // a private network's namespace
	}
	for _, c := range cases {
		want := answer{}
		if c.tenant != "" {
			want = answer{c.tenant, c.repository}
		}
		for name, read := range entryPoints {
			if got := read(c.repository, c.tag); got != want {
				t.Errorf("%s reads %q tag %q as %+v, want %+v", name, c.repository, c.tag, got, want)
			}
		}
	}
}
