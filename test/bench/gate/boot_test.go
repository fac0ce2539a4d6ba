package gate

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/imagepipe/imagepipe/internal/bootcheck"
	"github.com/imagepipe/imagepipe/internal/gate"
	"github.com/imagepipe/imagepipe/internal/need"
)

// benchBoot is the BootCheck part: the gate's boot check (bootcheck as
// gate.BootCheck runs it: its seed, the agent's port, the default
// signals, QEMU as nobody when run as root) on the guests test/guests.sh
// builds, under the accelerator that boots guests here, and under TCG
// too when that is KVM.
func benchBoot(t testing.TB) string {
	dir := need.Guests(t)
	tmp, err := os.MkdirTemp("", "bench-boot-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	seed := filepath.Join(tmp, "seed.iso")
	f, err := os.Create(seed)
	if err != nil {
		t.Fatal(err)
	}
	if err := bootcheck.WriteSeed(f, gate.BootSeed); err != nil {
		t.Fatal(err)
	}
	f.Close()
	probe := filepath.Join(tmp, "probe.raw")
	if f, err = os.Create(probe); err != nil {
		t.Fatal(err)
	}
	if err := bootcheck.WriteProbe(f); err != nil {
		t.Fatal(err)
	}
	f.Close()
	base := bootcheck.Options{Seed: seed, Agent: true, MemoryMiB: 1024, Deadline: 10 * time.Minute, Credential: need.QEMUUser(t), TempDir: tmp}
	accels := []string{bootcheck.Accelerator(t.Context(), probe, withSignal(base))}
	if accels[0] == "kvm" {
		accels = append(accels, "tcg")
	}

	var b strings.Builder
	fmt.Fprintf(&b, "\nBoot check: each guest test/guests.sh builds booted as the gate's boot check boots it (its NoCloud seed, the guest agent's port, QEMU as nobody, 1 GiB of guest memory), median of %d; the time is QEMU's start to the first signal (a login prompt, cloud-init's final message or the agent's answer); peak memory is QEMU's (rusage). KVM was tried with a probe disk: this machine boots guests under %s.\n\n", reps, accels[0])
	fmt.Fprintf(&b, "| guest | accelerator | signal | time | QEMU peak memory | target | |\n| --- | --- | --- | ---: | ---: | ---: | --- |\n")
	for _, accel := range accels {
		for _, g := range []struct{ disk, firmware string }{{"bios.raw", "bios"}, {"uefi.raw", "uefi"}, {"debian.raw", "bios"}} {
			var secs, peaks []float64
			signal := ""
			for range reps {
				o := base
				o.Accel, o.Firmware = accel, bootcheck.Firmware(g.firmware)
				if g.disk != "debian.raw" {
					o = withSignal(o) // the small guests print their own
				}
				rep, err := bootcheck.Boot(t.Context(), filepath.Join(dir, g.disk), o)
				if err != nil || !rep.Booted {
					t.Fatalf("%s under %s: %+v, %v", g.disk, accel, rep, err)
				}
				secs, peaks, signal = append(secs, rep.Elapsed.Seconds()), append(peaks, float64(rep.PeakMemory)), rep.Signal
			}
			target, ok := "", ""
			if g.disk == "debian.raw" {
				target, ok = "about 60 s", verdict(median(secs) <= 90)
			}
			fmt.Fprintf(&b, "| %s (%s) | %s | %.40q | %.1f s | %.0f MiB | %s | %s |\n", g.disk, g.firmware, accel, signal, median(secs), slowest(peaks)/(1<<20), target, ok)
		}
	}
	return b.String()
}

// withSignal adds the small guests' boot signal to o's.
func withSignal(o bootcheck.Options) bootcheck.Options {
	o.Signals = append([]*regexp.Regexp{regexp.MustCompile(`IMAGEPIPE-GUEST-BOOTED|` + bootcheck.ProbeSignal)}, bootcheck.DefaultSignals...)
	return o
}
