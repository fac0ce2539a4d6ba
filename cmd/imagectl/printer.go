package main

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"sigs.k8s.io/yaml"
)

// outputFormat is the value of a command's -o flag.
type outputFormat string

const (
	outputTable outputFormat = "table"
	outputJSON  outputFormat = "json"
	outputYAML  outputFormat = "yaml"
)

// parseOutput validates -o against the formats a command offers.
func parseOutput(s string, allowed ...outputFormat) (outputFormat, error) {
	if f := outputFormat(s); slices.Contains(allowed, f) {
		return f, nil
	}
	names := make([]string, len(allowed))
	for i, f := range allowed {
		names[i] = string(f)
	}
	return "", fmt.Errorf("unknown output format %q (%s)", s, strings.Join(names, ", "))
}

// print writes v as JSON or YAML (the pkg/api model, field names as in
// JSON), or as the table that table draws.
func (f outputFormat) print(w io.Writer, v any, table func(tw *tabwriter.Writer)) error {
	switch f {
	case outputJSON:
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case outputYAML:
		b, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	table(tw)
	return tw.Flush()
}

// shortDigest is the first 12 hex digits of a "sha256:..." digest.
func shortDigest(d string) string {
	hex := strings.TrimPrefix(d, "sha256:")
	return hex[:min(12, len(hex))]
}

// orDash shows an empty field as "-".
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
