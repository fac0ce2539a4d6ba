package intake

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
)

const (
	dig1 = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	dig2 = "sha256:2222222222222222222222222222222222222222222222222222222222222222"
)

// zotDigest is the digest of the manifest in the zot fixtures.
const zotDigest = "sha256:b9414191426c4729ac77a52a941413dbd064f1cbc1b102e80f703b431fd67c09"

// readDelivery reads a webhook delivery kept in testdata/webhooks (see its
// README): the HTTP headers, a blank line, then the body as sent.
func readDelivery(tb testing.TB, name string) (http.Header, []byte) {
	tb.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", "webhooks", name))
	if err != nil {
		tb.Fatal(err)
	}
	r := bufio.NewReader(bytes.NewReader(raw))
	h, err := textproto.NewReader(r).ReadMIMEHeader()
	if err != nil {
		tb.Fatalf("reading the headers of %s: %v", name, err)
	}
	body, err := io.ReadAll(r)
	if err != nil {
		tb.Fatal(err)
	}
	return http.Header(h), body
}

// TestParseWebhookDeliveries parses whole deliveries (headers and body) as
// registries send them.
func TestParseWebhookDeliveries(t *testing.T) {
	tests := []struct {
		file string
		want []Event
	}{
		{"zot-image-updated-binary.txt", []Event{{ActionPush, "acme/fedora", "41", zotDigest, "zot"}}},
		{"zot-image-updated-structured.txt", []Event{{ActionPush, "acme/fedora", "41", zotDigest, "zot"}}},
		{"zot-image-updated-by-digest-binary.txt", []Event{{ActionPush, "acme/fedora", "", zotDigest, "zot"}}},
		{"zot-image-deleted-binary.txt", []Event{{ActionDelete, "acme/fedora", "40", zotDigest, "zot"}}},
		{"zot-image-deleted-structured.txt", []Event{{ActionDelete, "acme/fedora", "40", zotDigest, "zot"}}},
		{"zot-repository-created-binary.txt", nil},
		{"zot-image-lint-failed-binary.txt", nil},
	}
	for _, tt := range tests {
		t.Run(strings.TrimSuffix(tt.file, ".txt"), func(t *testing.T) {
			header, body := readDelivery(t, tt.file)
			got, err := ParseWebhook(header, body)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestParseWebhook(t *testing.T) {
	tests := []struct {
		name   string
		header http.Header
		body   string
		want   []Event
		bad    bool
	}{
		{
			name: "distribution push, blob and pull ignored",
			body: `{"events":[
				{"action":"push","target":{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"` + dig2 + `","repository":"acme/rhel"}},
				{"action":"push","target":{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"` + dig1 + `","repository":"acme/rhel","tag":"10"}},
				{"action":"pull","target":{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"` + dig1 + `","repository":"acme/rhel","tag":"10"}}]}`,
			want: []Event{{ActionPush, "acme/rhel", "10", dig1, "distribution"}},
		},
		{
			name: "distribution delete by digest",
			body: `{"events":[{"action":"delete","target":{"digest":"` + dig1 + `","repository":"acme/rhel"}}]}`,
			want: []Event{{ActionDelete, "acme/rhel", "", dig1, "distribution"}},
		},
		{
			name: "harbor default push",
			body: `{"type":"PUSH_ARTIFACT","occur_at":1700000000,"operator":"admin","event_data":{"resources":[{"digest":"` + dig1 + `","tag":"41","resource_url":"harbor.example.com/acme/fedora:41"}],"repository":{"name":"fedora","namespace":"acme","repo_full_name":"acme/fedora","repo_type":"private"}}}`,
			want: []Event{{ActionPush, "acme/fedora", "41", dig1, "harbor"}},
		},
		{
			name: "harbor untagged push names the digest in the tag field",
			body: `{"type":"PUSH_ARTIFACT","event_data":{"resources":[{"digest":"` + dig1 + `","tag":"` + dig1 + `"}],"repository":{"repo_full_name":"acme/fedora"}}}`,
			want: []Event{{ActionPush, "acme/fedora", "", dig1, "harbor"}},
		},
		{
			name: "harbor pull ignored",
			body: `{"type":"PULL_ARTIFACT","event_data":{"resources":[{"digest":"` + dig1 + `","tag":"41"}],"repository":{"repo_full_name":"acme/fedora"}}}`,
		},
		{
			name: "harbor structured cloudevent delete",
			body: `{"specversion":"1.0","id":"1","source":"/projects/1/webhook/policies/1","type":"harbor.artifact.deleted","datacontenttype":"application/json","data":{"resources":[{"digest":"` + dig2 + `","tag":"old"}],"repository":{"repo_full_name":"acme/fedora"}}}`,
			want: []Event{{ActionDelete, "acme/fedora", "old", dig2, "harbor"}},
		},
		{
			name:   "harbor binary cloudevent push",
			header: http.Header{"Ce-Type": {"harbor.artifact.pushed"}, "Ce-Specversion": {"1.0"}},
			body:   `{"resources":[{"digest":"` + dig1 + `","tag":"1"}],"repository":{"repo_full_name":"acme/alma"}}`,
			want:   []Event{{ActionPush, "acme/alma", "1", dig1, "harbor"}},
		},
		{
			name: "quay repo_push has no digest",
			body: `{"name":"rhel","repository":"acme/rhel","namespace":"acme","docker_url":"quay.io/acme/rhel","homepage":"https://quay.io/repository/acme/rhel","updated_tags":["10","latest"]}`,
			want: []Event{{ActionPush, "acme/rhel", "10", "", "quay"}, {ActionPush, "acme/rhel", "latest", "", "quay"}},
		},
		{
			name:   "zot binary delete by digest",
			header: http.Header{"Ce-Type": {"zotregistry.image.deleted"}, "Ce-Specversion": {"1.0"}, "Ce-Source": {"zotregistry.dev"}},
			body:   `{"name":"acme/rhel","reference":"` + dig2 + `","digest":"` + dig2 + `","mediaType":"application/vnd.oci.image.index.v1+json"}`,
			want:   []Event{{ActionDelete, "acme/rhel", "", dig2, "zot"}},
		},
		{
			name:   "zot binary scan result ignored",
			header: http.Header{"Ce-Type": {"zotregistry.image.scanned"}, "Ce-Specversion": {"1.0"}},
			body:   `{"name":"acme/rhel","reference":"10","digest":"` + dig1 + `","summary":{"count":0}}`,
		},
		{
			name:   "zot type under a custom prefix ignored",
			header: http.Header{"Ce-Type": {"com.example.registry.image.updated"}, "Ce-Specversion": {"1.0"}},
			body:   `{"name":"acme/rhel","reference":"10","digest":"` + dig1 + `"}`,
		},
		{
			name:   "zot invalid repository",
			header: http.Header{"Ce-Type": {"zotregistry.image.updated"}},
			body:   `{"name":"Acme/../rhel","reference":"10","digest":"` + dig1 + `"}`,
			bad:    true,
		},
		{
			name:   "zot invalid tag",
			header: http.Header{"Ce-Type": {"zotregistry.image.updated"}},
			body:   `{"name":"acme/rhel","reference":"-10","digest":"` + dig1 + `"}`,
			bad:    true,
		},
		{
			name:   "zot reference is a digest of another algorithm",
			header: http.Header{"Ce-Type": {"zotregistry.image.deleted"}},
			body:   `{"name":"acme/rhel","reference":"sha512:abc"}`,
			bad:    true,
		},
		{
			name:   "zot neither tag nor digest",
			header: http.Header{"Ce-Type": {"zotregistry.image.deleted"}},
			body:   `{"name":"acme/rhel","reference":""}`,
			bad:    true,
		},
		{
			name:   "zot data not an object",
			header: http.Header{"Ce-Type": {"zotregistry.image.updated"}},
			body:   `["acme/rhel"]`,
			bad:    true,
		},
		{
			name: "zot structured without data",
			body: `{"specversion":"1.0","id":"1","source":"zotregistry.dev","type":"zotregistry.image.updated"}`,
			bad:  true,
		},
		{name: "not json", body: `events=1`, bad: true},
		{name: "truncated", body: `{"events":[{"action":"push"`, bad: true},
		{name: "unknown shape", body: `{"hello":"world"}`, bad: true},
		{name: "invalid repository", body: `{"events":[{"action":"delete","target":{"digest":"` + dig1 + `","repository":"../etc"}}]}`, bad: true},
		{name: "invalid digest", body: `{"events":[{"action":"delete","target":{"digest":"sha256:zz","repository":"acme/rhel"}}]}`, bad: true},
		{name: "invalid tag", body: `{"updated_tags":["bad tag"],"repository":"acme/rhel"}`, bad: true},
		{name: "neither tag nor digest", body: `{"events":[{"action":"delete","target":{"repository":"acme/rhel"}}]}`, bad: true},
		{name: "too many events", body: `{"updated_tags":[` + strings.Repeat(`"t",`, MaxEventsPerBody) + `"t"],"repository":"acme/rhel"}`, bad: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			header := tt.header
			if header == nil {
				header = http.Header{}
			}
			got, err := ParseWebhook(header, []byte(tt.body))
			if tt.bad {
				if err == nil {
					t.Fatalf("accepted %q: %+v", tt.body, got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

// TestEveryWebhookFormatIsBoundedPerBody: each format that carries many
// events in one body (distribution's envelope, Harbor's resources in its
// default payload and in its CloudEvents, structured and binary, Quay's
// updated tags) is read up to MaxEventsPerBody events and refused as
// malformed past it. zot's CloudEvents carry one event each.
func TestEveryWebhookFormatIsBoundedPerBody(t *testing.T) {
	join := func(n int, item func(i int) string) string {
		items := make([]string, n)
		for i := range items {
			items[i] = item(i)
		}
		return strings.Join(items, ",")
	}
	harborData := func(n int) string {
		return `{"resources":[` + join(n, func(i int) string { return fmt.Sprintf(`{"digest":"%s","tag":"t%d"}`, dig1, i) }) + `],"repository":{"repo_full_name":"acme/rhel"}}`
	}
	formats := []struct {
		name   string
		header http.Header
		body   func(n int) string
	}{
		{"distribution", nil, func(n int) string {
			return `{"events":[` + join(n, func(i int) string {
				return fmt.Sprintf(`{"action":"push","target":{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"%s","repository":"acme/rhel","tag":"t%d"}}`, dig1, i)
			}) + `]}`
		}},
		{"harbor default", nil, func(n int) string { return `{"type":"PUSH_ARTIFACT","event_data":` + harborData(n) + `}` }},
		{"harbor structured cloudevent", nil, func(n int) string {
			return `{"specversion":"1.0","id":"1","source":"/projects/1","type":"harbor.artifact.pushed","data":` + harborData(n) + `}`
		}},
		{"harbor binary cloudevent", http.Header{"Ce-Type": {"harbor.artifact.pushed"}, "Ce-Specversion": {"1.0"}}, harborData},
		{"quay", nil, func(n int) string {
			return `{"repository":"acme/rhel","updated_tags":[` + join(n, func(i int) string { return fmt.Sprintf(`"t%d"`, i) }) + `]}`
		}},
	}
	for _, f := range formats {
		t.Run(f.name, func(t *testing.T) {
			header := f.header
			if header == nil {
				header = http.Header{}
			}
			events, err := ParseWebhook(header, []byte(f.body(MaxEventsPerBody)))
			if err != nil || len(events) != MaxEventsPerBody {
				t.Errorf("%d events: read %d, error %v; want all of them", MaxEventsPerBody, len(events), err)
			}
			body := f.body(MaxEventsPerBody + 1)
			if len(body) > MaxWebhookBody {
				t.Fatalf("the body of %d events is %d bytes, over MaxWebhookBody: the size bound would refuse it first", MaxEventsPerBody+1, len(body))
			}
			if events, err := ParseWebhook(header, []byte(body)); !errors.Is(err, ErrMalformed) {
				t.Errorf("%d events: read %d, error %v; want refused as malformed", MaxEventsPerBody+1, len(events), err)
			}
		})
	}
}

func TestWebhookHandler(t *testing.T) {
	var mu sync.Mutex
	var got []Event
	h, err := NewWebhookHandler("s3cret", func(ev []Event) { mu.Lock(); got = append(got, ev...); mu.Unlock() }, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	push := `{"events":[{"action":"push","target":{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"` + dig1 + `","repository":"acme/rhel","tag":"10"}}]}`
	post := func(auth, body string) int {
		url := srv.URL
		if q, ok := strings.CutPrefix(auth, "?"); ok {
			url, auth = url+"/?"+q, ""
		}
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/vnd.docker.distribution.events.v2+json")
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, tc := range []struct {
		auth, body string
		want       int
	}{
		{"", push, http.StatusUnauthorized},
		{"Bearer wrong", push, http.StatusUnauthorized},
		{"Basic czNjcmV0", push, http.StatusUnauthorized},
		{"Bearer s3cret", `{"events":[`, http.StatusBadRequest},
		{"Bearer s3cret", strings.Repeat(" ", MaxWebhookBody+1), http.StatusBadRequest},
		{"?token=wrong", push, http.StatusUnauthorized},
		{"?token=", push, http.StatusUnauthorized},
		{"Bearer s3cret", push, http.StatusAccepted},
		{"?token=s3cret", push, http.StatusAccepted},
	} {
		if code := post(tc.auth, tc.body); code != tc.want {
			t.Errorf("auth %q, body %.30q: %d, want %d", tc.auth, tc.body, code, tc.want)
		}
	}
	if len(got) != 2 || got[0].Tag != "10" || got[1].Tag != "10" {
		t.Errorf("events handed on: %+v, want only the authenticated valid push", got)
	}
	if _, err := NewWebhookHandler("", nil, nil); err == nil {
		t.Error("an empty token was accepted")
	}
}

// TestWebhookQueryTokenOnlyWithoutAnAuthorizationHeader: the "token"
// query parameter is read only from a request with no Authorization
// header (Quay's, which cannot send one). Beside a header, the header
// alone is the credential: a Basic or other non-Bearer header, or a wrong
// bearer token, is refused even with the right token in the query, and
// nothing is handed on.
func TestWebhookQueryTokenOnlyWithoutAnAuthorizationHeader(t *testing.T) {
	var mu sync.Mutex
	handed := 0
	h, err := NewWebhookHandler("s3cret", func(ev []Event) { mu.Lock(); handed += len(ev); mu.Unlock() }, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	push := `{"events":[{"action":"push","target":{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"` + dig1 + `","repository":"acme/rhel","tag":"10"}}]}`
	for _, tc := range []struct {
		auth, query string
		want        int
	}{
		{"Basic czNjcmV0", "s3cret", http.StatusUnauthorized},
		{"Basic dG9rZW46czNjcmV0", "s3cret", http.StatusUnauthorized},
		{"Token s3cret", "s3cret", http.StatusUnauthorized},
		{"s3cret", "s3cret", http.StatusUnauthorized},
		{"Bearer wrong", "s3cret", http.StatusUnauthorized},
		{"Bearer s3cret", "wrong", http.StatusAccepted},
		{"", "s3cret", http.StatusAccepted},
	} {
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/?token="+tc.query, strings.NewReader(push))
		if err != nil {
			t.Fatal(err)
		}
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("Authorization %q, ?token=%s: %d, want %d", tc.auth, tc.query, resp.StatusCode, tc.want)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if handed != 2 {
		t.Errorf("%d events handed on, want the 2 of the accepted requests", handed)
	}
}

// FuzzParseWebhook: no body makes the parser panic; every error it returns
// is an ErrMalformed; and the events it returns are at most
// MaxEventsPerBody, each a push or delete from a known source with valid
// names. ceType is the Ce-Type header of a binary
// CloudEvent, empty for every other format. Seeds: one body of each format
// and the deliveries in testdata/webhooks.
func FuzzParseWebhook(f *testing.F) {
	f.Add("", []byte(`{"events":[{"action":"push","target":{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"`+dig1+`","repository":"acme/rhel","tag":"10"}}]}`))
	f.Add("", []byte(`{"type":"PUSH_ARTIFACT","event_data":{"resources":[{"digest":"`+dig1+`","tag":"41"}],"repository":{"repo_full_name":"acme/fedora"}}}`))
	f.Add("", []byte(`{"specversion":"1.0","type":"harbor.artifact.deleted","data":{"resources":[{"tag":"x"}],"repository":{"repo_full_name":"a/b"}}}`))
	f.Add("harbor.artifact.pushed", []byte(`{"resources":[{"digest":"`+dig1+`","tag":"1"}],"repository":{"repo_full_name":"acme/alma"}}`))
	f.Add("", []byte(`{"repository":"acme/rhel","updated_tags":["10"]}`))
	files, err := filepath.Glob(filepath.Join("testdata", "webhooks", "*.txt"))
	if err != nil || len(files) == 0 {
		f.Fatalf("no deliveries in testdata/webhooks: %v", err)
	}
	for _, file := range files {
		header, body := readDelivery(f, filepath.Base(file))
		f.Add(header.Get("Ce-Type"), body)
	}
	f.Fuzz(func(t *testing.T, ceType string, body []byte) {
		header := http.Header{}
		if ceType != "" {
			header.Set("Ce-Type", ceType)
		}
		events, err := ParseWebhook(header, body)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v is not an ErrMalformed: the handler would not answer 400", err)
			}
			return
		}
		if len(events) > MaxEventsPerBody {
			t.Fatalf("%d events from one body, over %d", len(events), MaxEventsPerBody)
		}
		for _, e := range events {
			if e.validate() != nil || (e.Action != ActionPush && e.Action != ActionDelete) {
				t.Fatalf("invalid event returned: %+v", e)
			}
			switch e.Source {
			case "distribution", "harbor", "quay", "zot":
			default:
				t.Fatalf("event from unknown source %q: %+v", e.Source, e)
			}
		}
	})
}
