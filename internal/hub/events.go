package hub

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"

	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
)

// Event reasons of the Kubernetes Events the Reconciler records on a
// BaseImage. A rejection's reason is the condition reason of its first
// rejection code instead ("backing-file" gives BackingFile, as in the
// Rejected condition), and a BaseImage turning Failed records its
// Progressing reason (RetriesExhausted, Conflict).
const (
	// EventRetrying: an import attempt failed and another one follows
	// (Warning), or the retry annotation started the attempts over
	// (Normal).
	EventRetrying = "Retrying"
)

// statusEvent is one Kubernetes Event a change of a BaseImage's status
// calls for.
type statusEvent struct {
	Type, Reason, Message string
}

// statusEvents returns the Events that the change of a BaseImage's status
// from before to after calls for, at most one per transition:
//
//   - the gate's verdict refuses the digest (Warning, the rejection's reason);
//   - an import attempt failed and will be retried (Warning, Retrying);
//   - the BaseImage turned Failed: retries exhausted or a conflict (Warning,
//     the Progressing condition's reason);
//   - the retry annotation took it out of Failed (Normal, Retrying).
//
// A status written again unchanged, or a reconcile that changes nothing,
// calls for none, so Events are bounded by the transitions: per digest one
// rejection, or at most max-attempts failures.
func statusEvents(before, after *v1alpha1.BaseImageStatus) []statusEvent {
	var out []statusEvent
	progressing := meta.FindStatusCondition(after.Conditions, v1alpha1.ConditionProgressing)
	// A digest waiting for the gate's verdict (NoVerdict) is no rejection
	// yet: the verdict usually follows within a second.
	if rej := meta.FindStatusCondition(after.Conditions, v1alpha1.ConditionRejected); rej != nil && rej.Status == "True" && rej.Reason != ReasonNoVerdict {
		was := meta.IsStatusConditionTrue(before.Conditions, v1alpha1.ConditionRejected) && before.ObservedDigest == after.ObservedDigest
		if !was {
			out = append(out, statusEvent{corev1.EventTypeWarning, rej.Reason, "digest " + after.ObservedDigest + ": " + rej.Message})
		}
	}
	sameDigest := before.ObservedDigest == after.ObservedDigest
	switch {
	case after.Phase == v1alpha1.PhaseFailed && before.Phase != v1alpha1.PhaseFailed && progressing != nil:
		out = append(out, statusEvent{corev1.EventTypeWarning, progressing.Reason, progressing.Message})
	case after.Phase != v1alpha1.PhaseFailed && sameDigest && after.Attempts > before.Attempts && progressing != nil:
		out = append(out, statusEvent{corev1.EventTypeWarning, EventRetrying, progressing.Message})
	case before.Phase == v1alpha1.PhaseFailed && after.Phase == v1alpha1.PhaseImporting && sameDigest &&
		progressing != nil && progressing.Reason == EventRetrying:
		out = append(out, statusEvent{corev1.EventTypeNormal, EventRetrying, progressing.Message})
	}
	return out
}

// recordEvents records on bi the Events that its status change from
// before calls for (statusEvents). It is called once the status saying so
// is stored, so that an update that failed and is retried records nothing
// twice. A nil Recorder records nothing.
func (r *Reconciler) recordEvents(bi *v1alpha1.BaseImage, before *v1alpha1.BaseImageStatus) {
	if r.Recorder == nil {
		return
	}
	for _, e := range statusEvents(before, &bi.Status) {
		r.Recorder.Event(bi, e.Type, e.Reason, e.Message)
	}
}
