package registry

import (
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// listTags returns a repository's tags; a repository that does not exist has none.
func listTags(t *testing.T, host, repo string) []string {
	t.Helper()
	r, err := name.NewRepository(host + "/" + repo)
	if err != nil {
		t.Fatal(err)
	}
	tags, err := remote.List(r)
	if err != nil {
		return nil
	}
	return tags
}

// waitABit pauses a polling loop; it times nothing.
func waitABit() { time.Sleep(20 * time.Millisecond) }
