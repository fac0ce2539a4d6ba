package hub

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
)

// TestStatusEventsOnePerTransition: each transition an operator must see
// calls for exactly one Event, and writing the same status again calls
// for none, so a BaseImage reconciled over and over records nothing new.
func TestStatusEventsOnePerTransition(t *testing.T) {
	const d1, d2 = "sha256:1111", "sha256:2222"
	cond := func(typ string, status bool, reason, msg string) metav1.Condition {
		s := metav1.ConditionFalse
		if status {
			s = metav1.ConditionTrue
		}
		return metav1.Condition{Type: typ, Status: s, Reason: reason, Message: msg}
	}
	st := func(phase v1alpha1.Phase, digest string, attempts int32, conds ...metav1.Condition) v1alpha1.BaseImageStatus {
		return v1alpha1.BaseImageStatus{Phase: phase, ObservedDigest: digest, Attempts: attempts, Conditions: conds}
	}
	rejected := cond(v1alpha1.ConditionRejected, true, "BackingFile", "the image was refused at revalidation: backing-file: names base.qcow2")
	validated := cond(v1alpha1.ConditionRejected, false, "Validated", "passed")
	importing := cond(v1alpha1.ConditionProgressing, true, "Importing", "DataVolume x imports y")
	retrying := cond(v1alpha1.ConditionProgressing, true, "Retrying", "import attempt 1 of 3 failed (boom); retrying")
	exhausted := cond(v1alpha1.ConditionProgressing, false, "RetriesExhausted", "the import of sha256:1111 failed 3 times and is not retried")
	conflict := cond(v1alpha1.ConditionProgressing, false, "Conflict", "DataVolume acme/x belongs to someone else")
	startOver := cond(v1alpha1.ConditionProgressing, true, "Retrying", "imports start over, as asked with imagepipe.io/retry")

	for name, tc := range map[string]struct {
		before, after v1alpha1.BaseImageStatus
		want          []statusEvent
	}{
		"new digest awaiting the gate's verdict": {
			st(v1alpha1.PhaseReady, d1, 0, validated),
			st(v1alpha1.PhasePending, d1, 0, cond(v1alpha1.ConditionRejected, true, ReasonNoVerdict, "the gate has not given its verdict on "+d2+" yet")),
			nil,
		},
		"new digest rejected": {
			st(v1alpha1.PhasePending, "", 0), st(v1alpha1.PhaseRejected, d1, 0, rejected),
			[]statusEvent{{"Warning", "BackingFile", "digest " + d1 + ": " + rejected.Message}},
		},
		"rejected again, same digest": {
			st(v1alpha1.PhaseRejected, d1, 0, rejected), st(v1alpha1.PhaseRejected, d1, 0, rejected), nil,
		},
		"a rejected tag moves to another rejected digest": {
			st(v1alpha1.PhaseRejected, d1, 0, rejected), st(v1alpha1.PhaseRejected, d2, 0, rejected),
			[]statusEvent{{"Warning", "BackingFile", "digest " + d2 + ": " + rejected.Message}},
		},
		"validated and importing": {
			st(v1alpha1.PhasePending, "", 0), st(v1alpha1.PhaseImporting, d1, 0, validated, importing), nil,
		},
		"attempt failed, retried": {
			st(v1alpha1.PhaseImporting, d1, 0, validated, importing), st(v1alpha1.PhaseImporting, d1, 1, validated, retrying),
			[]statusEvent{{"Warning", "Retrying", retrying.Message}},
		},
		"retrying, unchanged": {
			st(v1alpha1.PhaseImporting, d1, 1, validated, retrying), st(v1alpha1.PhaseImporting, d1, 1, validated, retrying), nil,
		},
		"next attempt started": {
			st(v1alpha1.PhaseImporting, d1, 1, validated, retrying), st(v1alpha1.PhaseImporting, d1, 1, validated, importing), nil,
		},
		"last attempt failed": {
			st(v1alpha1.PhaseImporting, d1, 2, validated, importing), st(v1alpha1.PhaseFailed, d1, 3, validated, exhausted),
			[]statusEvent{{"Warning", "RetriesExhausted", exhausted.Message}},
		},
		"failed, reconciled again": {
			st(v1alpha1.PhaseFailed, d1, 3, validated, exhausted), st(v1alpha1.PhaseFailed, d1, 3, validated, exhausted), nil,
		},
		"conflict": {
			st(v1alpha1.PhaseImporting, d1, 0, validated, importing), st(v1alpha1.PhaseFailed, d1, 0, validated, conflict),
			[]statusEvent{{"Warning", "Conflict", conflict.Message}},
		},
		"retry annotation": {
			st(v1alpha1.PhaseFailed, d1, 3, validated, exhausted), st(v1alpha1.PhaseImporting, d1, 0, validated, startOver),
			[]statusEvent{{"Normal", "Retrying", startOver.Message}},
		},
		"new digest after giving up": {
			st(v1alpha1.PhaseFailed, d1, 3, validated, exhausted), st(v1alpha1.PhaseImporting, d2, 0, validated, importing), nil,
		},
	} {
		t.Run(name, func(t *testing.T) {
			got := statusEvents(&tc.before, &tc.after)
			if len(got) != len(tc.want) {
				t.Fatalf("events %+v, want %+v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("event %d: %+v, want %+v", i, got[i], tc.want[i])
				}
			}
		})
	}
}
