package guest

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/imagepipe/imagepipe/internal/bootcheck"
	"github.com/imagepipe/imagepipe/internal/need"
)

// TestTheBootCheckSeesTheDebianGuestBoot: internal/bootcheck's engine on
// the Debian guest. Given a seed bootcheck.WriteSeed made, the guest runs
// cloud-init from it to its final message (the guest kernel's ISO 9660
// reader and cloud-init's NoCloud read the seed), and with the agent's
// port given, its guest agent's answer is a signal too. QEMU runs as
// nobody when the test runs as root.
func TestTheBootCheckSeesTheDebianGuestBoot(t *testing.T) {
	dir := guests(t)
	seed := filepath.Join(need.ReachableTempDir(t), "seed.iso")
	f, err := os.Create(seed)
	if err != nil {
		t.Fatal(err)
	}
	if err := bootcheck.WriteSeed(f, []bootcheck.SeedFile{
		{Name: "meta-data", Data: []byte("instance-id: bootcheck\nlocal-hostname: bootcheck\n")},
		{Name: "user-data", Data: []byte("#cloud-config\n")},
	}); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	// cloud-init's final line in full, naming where its data came from.
	cloudInit := []*regexp.Regexp{regexp.MustCompile(bootcheck.DefaultSignals[0].String() + `.*Datasource \w+ \[seed=[^\]]+\]`)}
	for _, tc := range []struct {
		name    string
		opts    bootcheck.Options
		signal  string
		timeout time.Duration
	}{
		{"cloud-init", bootcheck.Options{Signals: cloudInit}, "Datasource DataSourceNoCloud [seed=/dev/vdb]", 15 * time.Minute},
		{"guest agent", bootcheck.Options{Signals: []*regexp.Regexp{regexp.MustCompile(`^never$`)}, Agent: true}, bootcheck.AgentSignal, 15 * time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.opts
			o.Seed, o.MemoryMiB, o.Deadline, o.Credential, o.TempDir = seed, 1024, tc.timeout, need.QEMUUser(t), need.ReachableTempDir(t)
			rep, err := bootcheck.Boot(t.Context(), filepath.Join(dir, "debian.raw"), o)
			if err != nil {
				t.Fatal(err)
			}
			if !rep.Booted || !strings.Contains(rep.Signal, tc.signal) {
				t.Fatalf("the Debian guest: booted %v, signal %q, %s; want %q\n%s", rep.Booted, rep.Signal, rep.Reason, tc.signal, strings.Join(rep.LastLines, "\n"))
			}
			t.Logf("the Debian guest signalled %q after %s (%s)", rep.Signal, rep.Elapsed.Round(time.Second), rep.Accel)
		})
	}
}
