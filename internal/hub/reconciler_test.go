package hub

import (
	"regexp"
	"testing"
	"time"
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
