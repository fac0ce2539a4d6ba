package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	stdlog "log"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/imagepipe/imagepipe/internal/daemon"
	"github.com/imagepipe/imagepipe/internal/version"
)

// TestLoggingOneFormat: after setUpLogging, what client-go and
// controller-runtime write through klog (global and contextual), what
// controller-runtime writes through logr and what the standard library's
// log package writes all come out in the syncer's one format and obey its
// level, klog's verbosity included.
func TestLoggingOneFormat(t *testing.T) {
	t.Cleanup(func() { klog.ClearLogger() })
	textLine := regexp.MustCompile(`^time=\S+ level=(DEBUG|INFO|WARN|ERROR) msg=`)
	for _, tc := range []struct {
		format, level string
		want, notWant []string
	}{
		// controller-runtime takes its logger once per process, so only the
		// first case checks its lines.
		{"json", "info", []string{"klog info", "klog infos", "klog error", "klog contextual", "ctrl info", "stdlog"}, []string{"klog v1", "ctrl v1"}},
		{"text", "info", []string{"klog info", "klog error", "stdlog"}, []string{"klog v1"}},
		{"json", "debug", []string{"klog v1", "klog v4", "klog info"}, []string{"klog v5"}},
		{"json", "warn", []string{"klog error"}, []string{"klog info", "klog contextual", "stdlog"}},
	} {
		t.Run(tc.format+" "+tc.level, func(t *testing.T) {
			var buf bytes.Buffer
			o := &options{daemon: daemon.Flags{LogFormat: tc.format, LogLevel: tc.level}}
			if _, err := o.setUpLogging(&buf); err != nil {
				t.Fatal(err)
			}
			klog.Info("klog info")
			klog.InfoS("klog infos", "key", "value")
			klog.Errorf("klog error: %v", errors.New("boom"))
			klog.V(1).Info("klog v1")
			klog.V(4).Info("klog v4")
			klog.V(5).Info("klog v5")
			klog.FromContext(context.Background()).Info("klog contextual")
			ctrl.Log.WithName("test").Info("ctrl info")
			ctrl.Log.V(1).Info("ctrl v1")
			stdlog.Print("stdlog")
			klog.Flush()

			seen := map[string]bool{}
			sc := bufio.NewScanner(&buf)
			for sc.Scan() {
				line := sc.Text()
				var msg string
				if tc.format == "json" {
					var rec map[string]any
					if err := json.Unmarshal([]byte(line), &rec); err != nil {
						t.Errorf("not a JSON line: %q", line)
						continue
					}
					if _, ok := rec["time"]; !ok || rec["level"] == nil {
						t.Errorf("a JSON line without time or level: %q", line)
					}
					msg, _ = rec["msg"].(string)
					if strings.HasPrefix(msg, "klog") && rec["logger"] != "klog" {
						t.Errorf("a klog line without logger=klog: %q", line)
					}
				} else {
					if !textLine.MatchString(line) {
						t.Errorf("not a text line of slog: %q", line)
						continue
					}
					msg = line
				}
				for _, w := range append(tc.want, tc.notWant...) {
					if strings.Contains(msg, w) && !strings.Contains(msg, w+"s") {
						seen[w] = true
					}
				}
			}
			for _, w := range tc.want {
				if !seen[w] {
					t.Errorf("%q missing from the log:\n%s", w, buf.String())
				}
			}
			for _, w := range tc.notWant {
				if seen[w] {
					t.Errorf("%q logged at level %s:\n%s", w, tc.level, buf.String())
				}
			}
		})
	}
}

// TestFatalErrorIsALogLine: an error that stops the syncer once logging is
// set up is its last log line, in the log format and with the version, and
// main is told not to print it again; a mistake in the flags, found
// before, is not logged.
func TestFatalErrorIsALogLine(t *testing.T) {
	t.Cleanup(func() { klog.ClearLogger() })
	missing := filepath.Join(t.TempDir(), "missing")
	cmd := newRootCmd()
	var stderr bytes.Buffer
	cmd.SetErr(&stderr)
	cmd.SetArgs([]string{"--registry", "r.example.com", "--gate-keys", "/k", "--webhook-listen", "", "--metrics-listen", "0", "--health-listen", "0", "--kubeconfig", missing})
	err := cmd.Execute()
	if !errors.As(err, new(loggedError)) {
		t.Fatalf("error %v is not marked as logged", err)
	}
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	var rec map[string]any
	if len(lines) != 1 || json.Unmarshal([]byte(lines[0]), &rec) != nil {
		t.Fatalf("stderr is not one JSON line:\n%s", stderr.String())
	}
	if rec["level"] != "ERROR" || rec["version"] != version.Get().Version || !strings.Contains(fmt.Sprint(rec["error"]), "(--kubeconfig): stat "+missing) {
		t.Errorf("the error line %v lacks level ERROR, the version or the error", rec)
	}

	cmd = newRootCmd()
	stderr.Reset()
	cmd.SetErr(&stderr)
	cmd.SetArgs([]string{"--webhook-listen", ""})
	if err := cmd.Execute(); err == nil || errors.As(err, new(loggedError)) || stderr.Len() != 0 {
		t.Errorf("a missing --registry: error %v, stderr %q; want a plain error for main to print", err, stderr.String())
	}
}
