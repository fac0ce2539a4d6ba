package gate

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/imagepipe/imagepipe/internal/bootcheck"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// BootCheck is the provider's boot check (image-gate --boot-check): each
// disk whose guest was read is booted once under QEMU, on a throwaway
// overlay, with the firmware the inspection found, a NIC that reaches
// nothing, a NoCloud seed and the guest agent's port, and the outcome is
// kept in its guest report (api.GuestBoot). It runs inside the image's
// verification, so it waits for and counts against its tenant's share.
//
// The guest's signal is the guest's own word: a hostile image can claim
// to boot. The check finds images that cannot boot as they are launched,
// not images that lie.
type BootCheck struct {
	// Options are bootcheck's, the firmware, format and seed aside.
	Options bootcheck.Options
}

// BootSeed is the NoCloud seed of every boot check: an instance with no
// user data, so cloud-init runs its stages and prints its final message.
var BootSeed = []bootcheck.SeedFile{
	{Name: "meta-data", Data: []byte("instance-id: imagepipe-boot-check\nlocal-hostname: boot-check\n")},
	{Name: "user-data", Data: []byte("#cloud-config\n")},
}

// maxBootLine bounds each serial line kept in a verdict, whose lines are
// the guest's bytes.
const maxBootLine = 256

// boot runs the boot check, when there is one, on the disk in f of format,
// whose guest g the inspection found, and records the outcome in g. It
// fails only when the check could not run (QEMU missing, the context
// ended): the verification then fails and is retried, so that no layer
// keeps "did not boot" for the gate's own trouble.
func (v *Verifier) boot(ctx context.Context, g *api.GuestReport, f *os.File, format string) error {
	if v.BootCheck == nil || g == nil {
		return nil
	}
	fw, err := bootcheck.FirmwareFor(g.Firmware)
	if err != nil {
		g.Boot = &api.GuestBoot{Reason: err.Error()}
		return nil
	}
	o := v.BootCheck.Options
	o.Firmware, o.Format = fw, format
	if o.Logger == nil {
		o.Logger = v.logger()
	}
	dir, err := os.MkdirTemp(o.TempDir, "seed-")
	if err != nil {
		return fmt.Errorf("making the boot check's seed: %w", err)
	}
	defer os.RemoveAll(dir)
	o.Seed = filepath.Join(dir, "seed.iso")
	seed, err := os.Create(o.Seed)
	if err == nil {
		err = bootcheck.WriteSeed(seed, BootSeed)
		if cerr := seed.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		return fmt.Errorf("writing the boot check's seed: %w", err)
	}
	// QEMU opens the disk read-only (snapshot=on) and takes a descriptor
	// of that mode only: a read-only one of the spool, unlinked or not.
	ro, err := os.Open(fmt.Sprintf("/proc/self/fd/%d", f.Fd()))
	if err != nil {
		return fmt.Errorf("opening the disk for the boot check: %w", err)
	}
	defer ro.Close()
	rep, err := bootcheck.BootFile(ctx, ro, o)
	if err != nil {
		return fmt.Errorf("the boot check could not run: %w", err)
	}
	b := &api.GuestBoot{Booted: rep.Booted, Seconds: rep.Elapsed.Round(100 * time.Millisecond).Seconds(),
		Firmware: string(rep.Firmware), Accelerator: rep.Accel, Signal: cut(rep.Signal, maxBootLine), Reason: rep.Reason}
	for _, l := range rep.LastLines {
		b.LastLines = append(b.LastLines, cut(l, maxBootLine))
	}
	g.Boot = b
	return nil
}

// unbooted is the boot of a disk the gate did not keep, so did not boot.
func (v *Verifier) unbooted(g *api.GuestReport, why string) {
	if v.BootCheck != nil && g != nil {
		g.Boot = &api.GuestBoot{Reason: "not booted: " + why}
	}
}

// cut is s in at most n bytes of valid UTF-8.
func cut(s string, n int) string {
	if len(s) > n {
		s = s[:n]
	}
	return strings.ToValidUTF8(s, "")
}
