package main

import "fmt"

// scaleBytes expresses n in the largest binary unit not above it.
func scaleBytes(n int64) (float64, string) {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB"}
	v, i := float64(n), 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	return v, units[i]
}

// humanBytes formats n as qemu-img does: "4 GiB (4294967296 bytes)".
func humanBytes(n int64) string {
	v, unit := scaleBytes(n)
	if unit == "B" {
		return fmt.Sprintf("%d B", n)
	}
	return fmt.Sprintf("%.3g %s (%d bytes)", v, unit, n)
}

// shortBytes formats n with one decimal, for tables and progress: "1.2 GiB".
func shortBytes(n int64) string {
	v, unit := scaleBytes(n)
	if unit == "B" {
		return fmt.Sprintf("%d B", n)
	}
	return fmt.Sprintf("%.1f %s", v, unit)
}
