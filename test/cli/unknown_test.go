package cli

import (
	"strings"
	"testing"

	"github.com/imagepipe/imagepipe/test/testenv"
)

// TestMistypedSubcommandsFail runs the built binary with the mistakes the
// issue names: each exits 1 with a suggestion instead of printing help
// and exiting 0. (The unit test in cmd/imagectl walks the whole tree.)
func TestMistypedSubcommandsFail(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"vm", "delte", "web"}, `unknown command "delte" for "imagectl vm"; did you mean "delete"?`},
		{[]string{"template", "remove", "x"}, `unknown command "remove" for "imagectl template"`},
		{[]string{"volume", "lst"}, `unknown command "lst" for "imagectl volume"; did you mean "list"?`},
		{[]string{"imprt", "a", "b"}, `unknown command "imprt" for "imagectl"; did you mean "import"?`},
	} {
		code, stdout, stderr := testenv.Exit(t, testenv.Imagectl, tc.args...)
		if code != 1 || !strings.Contains(stderr, tc.want) || stdout != "" {
			t.Errorf("imagectl %s: exit %d, stdout %q, stderr %q; want 1 and %q", strings.Join(tc.args, " "), code, stdout, stderr, tc.want)
		}
	}
}
