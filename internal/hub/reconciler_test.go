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

func TestRetryDelayIsBounded(t *testing.T) {
	prev := time.Duration(0)
	for n := int32(1); n <= 20; n++ {
		d := retryDelay(0, n)
		if d < prev || d > 10*time.Minute || d < 30*time.Second {
			t.Errorf("retryDelay(%d) = %s after %s", n, d, prev)
		}
		prev = d
	}
}
