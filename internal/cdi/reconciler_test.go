package cdi

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

func TestLabelValueFitsKubernetes(t *testing.T) {
	valuePattern := regexp.MustCompile(`^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$`)
	long := "v1234567890123456789012345678901234567890123456789012345678901234567890"
	for _, tag := range []string{"9", "latest", "_hidden", "v1.2-", long, "a..b", "-"} {
		if got := labelValue(tag); len(got) > 63 || !valuePattern.MatchString(got) {
			t.Errorf("labelValue(%q) = %q, not a valid label value", tag, got)
		}
	}
}
