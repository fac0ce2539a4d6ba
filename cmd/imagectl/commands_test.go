package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// TestUnknownSubcommandsFailAtEveryLevel walks the whole command tree: for
// every command with subcommands, an unknown one and a typo of a real one
// fail with exit code 1, name the command, and the typo gets a
// suggestion; "help" with an unknown topic fails the same way. Without
// arguments such a command prints its help and succeeds.
func TestUnknownSubcommandsFailAtEveryLevel(t *testing.T) {
	run := func(args ...string) (string, error) {
		root := newRootCmd()
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&out)
		root.SetArgs(args)
		err := root.ExecuteContext(t.Context())
		return out.String(), err
	}
	var groups []string
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			walk(sub)
		}
		if !c.HasSubCommands() {
			return
		}
		groups = append(groups, c.CommandPath())
		path := strings.Fields(c.CommandPath())[1:]
		var real string
		for _, sub := range c.Commands() {
			if sub.IsAvailableCommand() && len(sub.Name()) > 3 {
				real = sub.Name()
				break
			}
		}
		typo := real[:len(real)-1] // one letter short: "delet"
		for _, tc := range []struct {
			args    []string
			typed   string
			suggest string
		}{
			{append(append([]string{}, path...), "bogus-command", "web"), "bogus-command", ""},
			{append(append([]string{}, path...), typo, "web"), typo, real},
			{append(append([]string{"help"}, path...), "bogus-command"), "bogus-command", ""},
		} {
			out, err := run(tc.args...)
			want := fmt.Sprintf("unknown command %q for %q", tc.typed, c.CommandPath())
			if err == nil || describe(err).ExitCode != exitError || !strings.Contains(err.Error(), want) {
				t.Errorf("imagectl %s: error %v (exit %d), output %q; want exit 1 and %q", strings.Join(tc.args, " "), err, describe(err).ExitCode, out, want)
				continue
			}
			if tc.suggest != "" && !strings.Contains(err.Error(), fmt.Sprintf("did you mean %q", tc.suggest)) {
				t.Errorf("imagectl %s: %v; want the suggestion %q", strings.Join(tc.args, " "), err, tc.suggest)
			}
		}
		out, err := run(path...)
		if err != nil || !strings.Contains(out, "Available Commands:") {
			t.Errorf("imagectl %s: %v, output %q; want its help", strings.Join(path, " "), err, out)
		}
	}
	walk(newRootCmd())
	for _, want := range []string{"imagectl", "imagectl vm", "imagectl template", "imagectl volume", "imagectl completion"} {
		found := false
		for _, g := range groups {
			found = found || g == want
		}
		if !found {
			t.Errorf("the walk did not reach %q (it found %v)", want, groups)
		}
	}
}
