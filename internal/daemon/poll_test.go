package daemon

import (
	"context"
	"io"
	"log"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/imagepipe/imagepipe/internal/intake"
)

// everyTenant maps a repository to the tenant before its first slash.
type everyTenant struct{}

func (everyTenant) Namespace(repo string) (string, string, error) {
	tenant, _, _ := strings.Cut(repo, "/")
	return tenant, tenant, nil
}

// pass is what the loop handed on of one pass, and how many fast passes
// waited before it.
type pass struct {
	full   bool
	events int
	err    error
	waited int
}

// The first pass is full and hands on what it found; while work waits,
// fast passes wait MaxSkippedPasses ticks in a row, then one runs; the end
// of the context ends the loop without an error.
func TestPollLoop(t *testing.T) {
	srv := httptest.NewServer(ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	img, err := random.Image(64, 1)
	if err != nil {
		t.Fatal(err)
	}
	tag, err := name.NewTag(host + "/acme/rhel:9")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(tag, img); err != nil {
		t.Fatal(err)
	}
	f := Flags{Registry: host}
	reg, err := f.RegistryName()
	if err != nil {
		t.Fatal(err)
	}
	rc, err := f.RegistryClient("daemon-test", nil)
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var got []pass
	waited := 0
	loop := &PollLoop{
		Poller: intake.NewPoller(reg, rc, everyTenant{}), Interval: time.Millisecond, Resync: time.Hour,
		Waiting: func() int { return 1 },
		Skipped: func() { waited++ },
		Polled: func(full bool, events []intake.Event, err error) {
			got = append(got, pass{full, len(events), err, waited})
			waited = 0
			if len(got) == 3 {
				cancel()
			}
		},
	}
	if err := loop.Run(ctx); err != nil {
		t.Fatalf("Run: %v", err)
	}
	want := []pass{{true, 1, nil, 0}, {false, 0, nil, MaxSkippedPasses}, {false, 0, nil, MaxSkippedPasses}}
	if !slices.Equal(got, want) {
		t.Errorf("passes %+v, want %+v", got, want)
	}
}
