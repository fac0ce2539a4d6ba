package hub

import (
	"context"
	"errors"
	"regexp"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/imagepipe/imagepipe/internal/cdi"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
)

// Condition reasons must match metav1.Condition's pattern, or the API
// server refuses the status update that carries them.
func TestConditionReason(t *testing.T) {
	reasonPattern := regexp.MustCompile(`^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`)
	for codes, want := range map[string]string{
		"backing-file":                 "BackingFile",
		"unknown-incompatible-feature": "UnknownIncompatibleFeature",
		"layer-count":                  "LayerCount",
		"":                             "Rejected",
		"---":                          "Rejected",
	} {
		var in []string
		if codes != "" {
			in = []string{codes}
		}
		got := conditionReason(in)
		if got != want || !reasonPattern.MatchString(got) {
			t.Errorf("conditionReason(%q) = %q, want %q", codes, got, want)
		}
	}
}

// TestRetryDelayDoublesUpToTenMinutes: a failed import is retried after
// the base delay (30 s by default), doubling with each failure, never more
// than 10 minutes apart.
func TestRetryDelayDoublesUpToTenMinutes(t *testing.T) {
	tests := []struct {
		base     time.Duration
		attempts int32
		want     time.Duration
	}{
		{0, 0, 30 * time.Second},
		{0, 1, 30 * time.Second},
		{0, 2, time.Minute},
		{0, 3, 2 * time.Minute},
		{0, 5, 8 * time.Minute},
		{0, 6, 10 * time.Minute},
		{0, 1000, 10 * time.Minute},
		{time.Second, 1, time.Second},
		{time.Second, 4, 8 * time.Second},
		{time.Second, 6, 32 * time.Second},
		{time.Second, 7, 32 * time.Second}, // doubling stops after five
		{5 * time.Minute, 3, 10 * time.Minute},
	}
	for _, tc := range tests {
		if got := retryDelay(tc.base, tc.attempts); got != tc.want {
			t.Errorf("retryDelay(%s, %d) = %s, want %s", tc.base, tc.attempts, got, tc.want)
		}
	}
}

// newerReader is an API server read that always finds a newer version of
// the BaseImage than the one reconciled: the controller's cache lags.
type newerReader struct{}

func (newerReader) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	obj.SetName(key.Name)
	obj.SetNamespace(key.Namespace)
	obj.SetResourceVersion("2")
	return nil
}

func (newerReader) List(context.Context, client.ObjectList, ...client.ListOption) error {
	return errors.New("not used")
}

// TestNoImportFromAStaleCache: an import starts only from the current
// BaseImage; when the cache lags, startImport hands back the API server's
// copy to go on from (no DataVolume is created from the stale copy: the
// reconciler has no client to create one with). Requeues after errors go
// through the backoff: 50 ms, then doubling, so that a registry or API
// server that stays unavailable is not asked 20 times a second per
// BaseImage.
func TestNoImportFromAStaleCache(t *testing.T) {
	r := &Reconciler{APIReader: newerReader{}}
	bi := &v1alpha1.BaseImage{ObjectMeta: metav1.ObjectMeta{Namespace: "acme", Name: "rhel--9", ResourceVersion: "1"}}
	_, err := r.startImport(t.Context(), bi, cdi.Import{}, &cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Name: "rhel--0123"}})
	var stale *staleError
	if !errors.As(err, &stale) || stale.fresh.ResourceVersion != "2" {
		t.Fatalf("a stale BaseImage gives %v, want the API server's copy (resource version 2)", err)
	}
	limiter := newRateLimiter()
	req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(bi)}
	want := []time.Duration{50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond}
	for i, w := range want {
		if got := limiter.When(req); got != w {
			t.Errorf("requeue %d after %s, want %s", i+1, got, w)
		}
	}
	for range 20 {
		limiter.When(req)
	}
	if got := limiter.When(req); got != 5*time.Minute {
		t.Errorf("requeue after many failures: %s, want the 5m bound", got)
	}
}

// An attempt fails once CDI gives up, or once its importer has restarted
// maxPodRestarts times and is not running: an importer running again has
// no failure message on the DataVolume yet (CDI clears it while it runs),
// and may still succeed.
func TestAttemptFailedWaitsForTheLastRunToEnd(t *testing.T) {
	dv := func(phase cdiv1.DataVolumePhase, restarts int32, running corev1.ConditionStatus) *cdiv1.DataVolume {
		return &cdiv1.DataVolume{Status: cdiv1.DataVolumeStatus{Phase: phase, RestartCount: restarts,
			Conditions: []cdiv1.DataVolumeCondition{{Type: cdiv1.DataVolumeRunning, Status: running}}}}
	}
	for _, c := range []struct {
		dv   *cdiv1.DataVolume
		want bool
	}{
		{dv(cdiv1.Failed, 0, corev1.ConditionFalse), true},
		{dv(cdiv1.ImportInProgress, maxPodRestarts, corev1.ConditionFalse), true},
		{dv(cdiv1.ImportInProgress, maxPodRestarts+1, corev1.ConditionFalse), true},
		{dv(cdiv1.ImportInProgress, maxPodRestarts, corev1.ConditionTrue), false},
		{dv(cdiv1.ImportInProgress, maxPodRestarts-1, corev1.ConditionFalse), false},
		{&cdiv1.DataVolume{Status: cdiv1.DataVolumeStatus{Phase: cdiv1.ImportInProgress, RestartCount: maxPodRestarts}}, true},
	} {
		if got := attemptFailed(c.dv); got != c.want {
			t.Errorf("phase %s, %d restarts, conditions %+v: failed %v, want %v", c.dv.Status.Phase, c.dv.Status.RestartCount, c.dv.Status.Conditions, got, c.want)
		}
	}
}
