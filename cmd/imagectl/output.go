package main

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"
)

// outputFormat is a value of the -o flag.
type outputFormat string

// The output formats, one set for every command (each offers those that
// make sense for it): table for people, wide a table with more columns,
// json and yaml the pkg/api model (field names as in JSON), name one
// reference or kind/name per line, as kubectl's -o name.
const (
	outputTable outputFormat = "table"
	outputWide  outputFormat = "wide"
	outputJSON  outputFormat = "json"
	outputYAML  outputFormat = "yaml"
	outputName  outputFormat = "name"
)

// Format sets the commands offer.
var (
	// resultFormats suit a command whose result is one object.
	resultFormats = []outputFormat{outputTable, outputJSON, outputYAML, outputName}
	// listFormats suit a command that lists objects.
	listFormats = []outputFormat{outputTable, outputWide, outputJSON, outputYAML, outputName}
)

// outputFlags is the one -o/--output flag group of imagectl, after oras's
// option.Format: every command that prints data embeds it, declares the
// formats it offers and its default, checks the choice before doing any
// work, and prints its result through print.
type outputFlags struct {
	format  outputFormat
	allowed []outputFormat
	// defaultFor, when set, picks the default once the other flags are
	// parsed (vm create: yaml with --dry-run, else table).
	defaultFor func() outputFormat
}

// addOutputFlag registers -o with the formats allowed, the first being the
// default.
func addOutputFlag(cmd *cobra.Command, o *outputFlags, allowed ...outputFormat) {
	o.allowed = allowed
	cmd.Flags().StringVarP((*string)(&o.format), "output", "o", string(allowed[0]), "output format: "+formatList(allowed))
}

// formatList reads "a, b or c".
func formatList(formats []outputFormat) string {
	names := make([]string, len(formats))
	for i, f := range formats {
		names[i] = string(f)
	}
	if len(names) == 1 {
		return names[0]
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// validate checks the chosen format; commands call it before any work.
func (o *outputFlags) validate() error {
	if o.format == "" && o.defaultFor != nil {
		o.format = o.defaultFor()
	}
	if slices.Contains(o.allowed, o.format) {
		return nil
	}
	return &usageError{fmt.Errorf("unknown output format %q (%s)", o.format, formatList(o.allowed))}
}

// machine reports whether the output is for programs (json or yaml).
func (o *outputFlags) machine() bool { return o.format == outputJSON || o.format == outputYAML }

// printer prints a command's result to standard output: v as JSON or
// YAML when the user asked for a machine format, else its human form.
// Every command prints its data through one: its outputFlags (-o).
type printer interface {
	print(w io.Writer, v any, human func(w io.Writer) error) error
}

var _ printer = (*outputFlags)(nil)

// print writes v as JSON or YAML, or calls human for the table or text
// form; for commands that offer neither wide nor name.
func (o *outputFlags) print(w io.Writer, v any, human func(w io.Writer) error) error {
	return o.show(w, view{data: v, table: func(w io.Writer, _ bool) error { return human(w) }})
}

// view is what a command prints, in each of its forms.
type view struct {
	// data is printed as JSON or YAML.
	data any
	// names are printed one per line for -o name.
	names []string
	// table prints the human form; wide asks for the extra columns.
	table func(w io.Writer, wide bool) error
}

// show prints v in the chosen format.
func (o *outputFlags) show(w io.Writer, r view) error {
	switch o.format {
	case outputJSON:
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(r.data)
	case outputYAML:
		b, err := yaml.Marshal(r.data)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	case outputName:
		for _, n := range r.names {
			if _, err := fmt.Fprintln(w, n); err != nil {
				return err
			}
		}
		return nil
	}
	return r.table(w, o.format == outputWide)
}

// table is the human form of a command that prints rows: draw writes
// tab-separated cells, aligned on flush.
func table(draw func(tw *tabwriter.Writer)) func(io.Writer) error {
	return func(w io.Writer) error {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		draw(tw)
		return tw.Flush()
	}
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
