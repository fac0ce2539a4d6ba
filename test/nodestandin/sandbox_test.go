package nodestandin

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/imagepipe/imagepipe/internal/need"
)

// requireSandbox skips unless this machine can make the sandbox's namespaces (root, unshare).
func requireSandbox(t *testing.T) {
	t.Helper()
	need.Root(t, "the sandbox makes mount and PID namespaces")
	need.Program(t, "unshare")
}

// TestSandboxShowsTheContainerOnlyItsOwnWorld runs a shell as a container and checks what the
// sandbox promises: it runs as its runAsUser with the fsGroup, sees its environment and
// nothing of the test's, writes its volume and termination message, and cannot see or write
// the host outside them.
func TestSandboxShowsTheContainerOnlyItsOwnWorld(t *testing.T) {
	requireSandbox(t)
	dir := t.TempDir()
	vol := filepath.Join(dir, "vol")
	secret := filepath.Join(dir, "secret")
	for _, d := range []string{vol, secret} {
		if err := os.Mkdir(d, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(vol, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(secret, "token"), []byte("s3cr3t"), 0o644); err != nil {
		t.Fatal(err)
	}
	term := filepath.Join(dir, "termination-log")
	if err := os.WriteFile(term, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(term, 0o666); err != nil {
		t.Fatal(err)
	}
	hostMarker := filepath.Join(dir, "host-only")
	if err := os.WriteFile(hostMarker, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("IMAGEPIPE_LEAK_CHECK", "leaked")
	fsGroup := int64(107)
	var log bytes.Buffer
	script := `set -u
echo "id=$(id -u):$(id -g) groups=$(id -G)"
echo "env=$GREETING leak=${IMAGEPIPE_LEAK_CHECK:-none}"
echo "pid=$$"
echo "token=$(cat /secret/token)"
echo hello >/data/written && echo "volume=ok"
echo "secret-write=$(echo x 2>/dev/null >/secret/token && echo yes || echo no)"
echo "usr-write=$(touch /usr/nodestandin 2>/dev/null && echo yes || echo no)"
echo "host-visible=$(test -e ` + quote(hostMarker) + ` && echo yes || echo no)"
echo "dev=$(ls /dev | tr '\n' ' ')"
echo "finished: all good" >/dev/termination-log
exit 3
`
	sb := &sandbox{
		root: filepath.Join(dir, "root"), entrypoint: "/bin/sh", args: []string{"-c", script},
		env: []string{"PATH=/usr/bin:/bin", "GREETING=hi there's"}, uid: 107, gid: 107, fsGroup: &fsGroup,
		mounts:         []mount{{kind: bindMount, host: vol, container: "/data"}, {kind: bindMount, host: secret, container: "/secret", readOnly: true}},
		terminationLog: term, terminationPath: "/dev/termination-log", log: &log,
	}
	if err := os.Mkdir(sb.root, 0o755); err != nil {
		t.Fatal(err)
	}
	code, err := sb.run(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	out := log.String()
	if code != 3 {
		t.Errorf("exit code %d, want 3\n%s", code, out)
	}
	for _, want := range []string{
		"id=107:107 groups=107", "env=hi there's leak=none", "pid=1", "token=s3cr3t", "volume=ok",
		"secret-write=no", "usr-write=no", "host-visible=no", "dev=fd full null random termination-log urandom zero",
	} {
		if !strings.Contains(out, want+"\n") && !strings.Contains(out, want+" \n") {
			t.Errorf("the container printed no %q:\n%s", want, out)
		}
	}
	if got, _ := os.ReadFile(filepath.Join(vol, "written")); string(got) != "hello\n" {
		t.Errorf("the volume holds %q, want what the container wrote", got)
	}
	if msg := terminationMessage(term, "", code, corev1.TerminationMessageFallbackToLogsOnError); msg != "finished: all good\n" {
		t.Errorf("termination message %q", msg)
	}
	if entries, _ := os.ReadDir(sb.root); len(entries) != 0 {
		t.Errorf("the container's root left %d entries on the host", len(entries))
	}
}

// TestTerminationMessageFallsBackToTheLogTail: kubelet's FallbackToLogsOnError takes the log's
// last 80 lines, at most 2048 bytes, only when the file is empty and the container failed.
func TestTerminationMessageFallsBackToTheLogTail(t *testing.T) {
	dir := t.TempDir()
	empty, log := filepath.Join(dir, "term"), filepath.Join(dir, "log")
	os.WriteFile(empty, nil, 0o644)
	var b strings.Builder
	for i := range 100 {
		b.WriteString(strings.Repeat("x", 10) + string(rune('a'+i%26)) + "\n")
	}
	os.WriteFile(log, []byte(b.String()), 0o644)
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	want := strings.Join(lines[20:], "\n")
	if got := terminationMessage(empty, log, 1, corev1.TerminationMessageFallbackToLogsOnError); got != want {
		t.Errorf("fallback message has %d bytes, want the last 80 lines (%d bytes)", len(got), len(want))
	}
	if got := terminationMessage(empty, log, 0, corev1.TerminationMessageFallbackToLogsOnError); got != "" {
		t.Errorf("a container that succeeded got message %q from its log", got)
	}
	if got := terminationMessage(empty, log, 1, corev1.TerminationMessageReadFile); got != "" {
		t.Errorf("policy File took the log: %q", got)
	}
	os.WriteFile(log, []byte(strings.Repeat("y", 5000)), 0o644)
	if got := terminationMessage(empty, log, 1, corev1.TerminationMessageFallbackToLogsOnError); len(got) != fallbackLogBytes {
		t.Errorf("fallback message has %d bytes, want at most %d", len(got), fallbackLogBytes)
	}
	os.WriteFile(empty, []byte(strings.Repeat("z", 9000)), 0o644)
	if got := terminationMessage(empty, log, 1, corev1.TerminationMessageFallbackToLogsOnError); len(got) != maxTerminationMessage {
		t.Errorf("message has %d bytes, want the file's first %d", len(got), maxTerminationMessage)
	}
}

// TestSandboxRefusesContainerPathsThatClimbOut: a volume's mount path comes from the pod spec;
// one that climbs out of the container's root is refused before anything is mounted.
func TestSandboxRefusesContainerPathsThatClimbOut(t *testing.T) {
	dir := t.TempDir()
	for _, p := range []string{"../../etc", "/data/../../etc", "relative", "/a/.."} {
		sb := &sandbox{root: dir, entrypoint: "/bin/true", mounts: []mount{{kind: bindMount, host: dir, container: p}}, terminationLog: dir, terminationPath: "/dev/termination-log"}
		if _, err := sb.script(); err == nil {
			t.Errorf("container path %q accepted", p)
		}
	}
}
