package daemon

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// flagLine is one flag's line in pflag's usage: its name and the rest
// (type, usage and default), spaces collapsed.
var flagLine = regexp.MustCompile(`^\s*(?:-\w, )?--([\w-]+)\s+(.*)$`)

// flagLines reads the flag lines of usage by flag name.
func flagLines(usage string) map[string]string {
	lines := map[string]string{}
	for _, l := range strings.Split(usage, "\n") {
		if m := flagLine.FindStringSubmatch(l); m != nil {
			lines[m[1]] = strings.Join(strings.Fields(m[2]), " ")
		}
	}
	return lines
}

// TestBothDaemonsShareTheFlags compares the options of image-gate and
// image-syncer, as their CLI reference shows them (which their own
// TestCLIReferenceIsCurrent keeps equal to the commands): every shared
// flag is on both, with the same type, help (and so the same way to turn
// a listener off) and default as Register gives it.
func TestBothDaemonsShareTheFlags(t *testing.T) {
	fs := pflag.NewFlagSet("daemon", pflag.ContinueOnError)
	new(Flags).Register(fs)
	want := flagLines(fs.FlagUsages())
	if len(want) == 0 {
		t.Fatal("no shared flags read from Register's usage")
	}
	for _, daemon := range []string{"image-gate", "image-syncer"} {
		doc, err := os.ReadFile("../../docs/cli/" + daemon + ".md")
		if err != nil {
			t.Fatal(err)
		}
		_, options, _ := strings.Cut(string(doc), "### Options\n\n```\n")
		options, _, _ = strings.Cut(options, "```")
		have := flagLines(options)
		for name, line := range want {
			if have[name] != line {
				t.Errorf("%s --%s: %q\n  want, as both daemons share it: %q", daemon, name, have[name], line)
			}
		}
	}
}
