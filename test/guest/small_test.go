package guest

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSmallGuestsBootWithTheirFirmware: the small disks test/guests.sh
// builds boot Debian's cloud kernel into their busybox init, which says on
// the serial console which firmware it booted from: bios.raw under
// SeaBIOS, uefi.raw under OVMF, hybrid.raw under both.
func TestSmallGuestsBootWithTheirFirmware(t *testing.T) {
	dir := guests(t)
	accel := accelerator(t, dir)
	for _, tc := range []struct {
		disk string
		fw   firmware
	}{
		{"bios.raw", bios},
		{"uefi.raw", uefi},
		{"hybrid.raw", bios},
		{"hybrid.raw", uefi},
	} {
		t.Run(tc.disk+"/"+string(tc.fw), func(t *testing.T) {
			m := boot(t, machineSpec{disk: filepath.Join(dir, tc.disk), firmware: tc.fw, accel: accel})
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
			defer cancel()
			start := time.Now()
			line, err := m.console.waitLine(ctx, bootSignal)
			if err != nil {
				t.Fatalf("%s under %s: no %q on the serial console: %v", tc.disk, tc.fw, bootSignal, err)
			}
			if want := bootSignal + " firmware=" + string(tc.fw); !strings.Contains(line, want) {
				t.Errorf("%s under %s said %q, want %q", tc.disk, tc.fw, line, want)
			}
			t.Logf("%s booted under %s (%s) in %s", tc.disk, tc.fw, accel, time.Since(start).Round(100*time.Millisecond))
		})
	}
}
