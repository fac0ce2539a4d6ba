package reject

import (
	"errors"
	"fmt"
	"testing"
)

func TestErrorsMatchAndRead(t *testing.T) {
	for _, tc := range []struct {
		reason Reason
		prefix string
	}{
		{BackingFile, "image rejected (backing-file): "},
		{SharedCluster, "image rejected (shared-cluster): "},
		{DiskOwner, "not a containerDisk (disk-owner): "},
		{LayerCount, "not a containerDisk (layer-count): "},
	} {
		err := fmt.Errorf("importing: %w", New(tc.reason, "detail %d", 7))
		if !errors.Is(err, ErrRejected) {
			t.Errorf("%s: errors.Is(ErrRejected) is false", tc.reason)
		}
		re := As(err)
		if re == nil || re.Reason != tc.reason || re.Detail != "detail 7" {
			t.Fatalf("%s: As = %+v", tc.reason, re)
		}
		if got := re.Error(); got != tc.prefix+"detail 7" {
			t.Errorf("%s: Error() = %q, want prefix %q", tc.reason, got, tc.prefix)
		}
	}
	if As(errors.New("connection refused")) != nil || errors.Is(errors.New("x"), ErrRejected) {
		t.Error("an ordinary error reads as a rejection")
	}
}
