// Package clidoc keeps the generated CLI reference (docs/cli) equal to the
// commands: the tests of cmd/imagectl and cmd/image-syncer call Check, and
// `make docs` runs them with UPDATE_DOCS=1 to rewrite the files.
package clidoc

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
)

// Check renders root's command tree into one Markdown file per
// command, and root's table of commands into dir's README.md between the
// markers "<!-- BEGIN NAME commands -->" and "<!-- END NAME commands -->".
// It reports every file that differs from what is in dir, and the files of
// commands that no longer exist. With UPDATE_DOCS=1 it writes the files and
// deletes the stale ones instead.
func Check(t testing.TB, root *cobra.Command, dir string) {
	t.Helper()
	root.DisableAutoGenTag = true // no date: the output depends only on the commands
	// What Execute adds before running, so that the reference shows it too.
	root.InitDefaultVersionFlag()
	root.InitDefaultCompletionCmd()
	tmp := t.TempDir()
	if err := doc.GenMarkdownTree(root, tmp); err != nil {
		t.Fatal(err)
	}
	want := map[string][]byte{}
	entries, err := os.ReadDir(tmp)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(tmp, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		want[e.Name()] = b
	}
	// The reference is committed: a default computed from the home or
	// cache directory of whoever generates it must not leak in.
	for _, dir := range []func() (string, error){os.UserHomeDir, os.UserCacheDir} {
		d, err := dir()
		if err != nil || len(d) < 2 {
			continue
		}
		for file, b := range want {
			if bytes.Contains(b, []byte(d)) {
				t.Errorf("%s contains %s from this machine; give the flag a fixed default", file, d)
			}
		}
	}

	index := filepath.Join(dir, "README.md")
	cur, err := os.ReadFile(index)
	if err != nil {
		t.Fatal(err)
	}
	begin, end := "<!-- BEGIN "+root.Name()+" commands -->\n", "<!-- END "+root.Name()+" commands -->"
	i, j := bytes.Index(cur, []byte(begin)), bytes.Index(cur, []byte(end))
	if i < 0 || j < i {
		t.Fatalf("%s lacks the markers %q and %q", index, strings.TrimSpace(begin), end)
	}
	var table bytes.Buffer
	table.WriteString("| command | what it does |\n| --- | --- |\n")
	var walk func(*cobra.Command)
	walk = func(c *cobra.Command) {
		if c != root && (!c.IsAvailableCommand() || c.IsAdditionalHelpTopicCommand()) {
			return
		}
		file := strings.ReplaceAll(c.CommandPath(), " ", "_") + ".md"
		fmt.Fprintf(&table, "| [`%s`](%s) | %s |\n", c.CommandPath(), file, strings.ReplaceAll(c.Short, "|", `\|`))
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	want["README.md"] = slices.Concat(cur[:i+len(begin)], table.Bytes(), cur[j:])

	var stale, gone []string
	for file, b := range want {
		have, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil || !bytes.Equal(have, b) {
			stale = append(stale, file)
		}
	}
	existing, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range existing {
		n := e.Name()
		if (n == root.Name()+".md" || strings.HasPrefix(n, root.Name()+"_")) && want[n] == nil {
			gone = append(gone, n)
		}
	}
	slices.Sort(stale)
	slices.Sort(gone)
	if len(stale) == 0 && len(gone) == 0 {
		return
	}
	if os.Getenv("UPDATE_DOCS") != "1" {
		t.Fatalf("docs/cli is out of date with the %s commands: run make docs\n  differ: %v\n  no longer a command: %v", root.Name(), stale, gone)
	}
	for _, file := range stale {
		if err := os.WriteFile(filepath.Join(dir, file), want[file], 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, file := range gone {
		if err := os.Remove(filepath.Join(dir, file)); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("docs/cli: wrote %v, removed %v", stale, gone)
}
