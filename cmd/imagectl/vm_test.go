package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestVMCreateWaitFlagsAreCheckedFirst: --wait and --timeout combinations
// that cannot mean anything fail before any file, registry or hub is
// touched (the kubeconfig and template named here do not exist).
func TestVMCreateWaitFlagsAreCheckedFirst(t *testing.T) {
	base := []string{"vm", "create", "web", "--image", "acme/rhel:9", "--template-file", "/nonexistent/t.yaml", "--kubeconfig", "/nonexistent/kubeconfig"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--wait", "--dry-run"}, "--wait has nothing to wait for with --dry-run"},
		{[]string{"--timeout", "1m"}, "--timeout bounds --wait; add --wait"},
		{[]string{"--wait", "--timeout", "0s"}, "--timeout 0s: want a positive duration"},
		{[]string{"--wait", "--timeout", "-5s"}, "--timeout -5s: want a positive duration"},
		{[]string{"--wait", "--timeout", "5"}, `invalid argument "5" for "--timeout"`},
	} {
		root := newRootCmd()
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&out)
		root.SetArgs(append(append([]string{}, base...), tc.args...))
		err := root.ExecuteContext(t.Context())
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("vm create %s: %v; want %q", strings.Join(tc.args, " "), err, tc.want)
		}
	}
}
