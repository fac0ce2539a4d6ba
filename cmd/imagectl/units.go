package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

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

// sizeUnits are the suffixes parseSize accepts: binary with or without the
// "i" (as qemu-img reads "G"), decimal with a "B".
var sizeUnits = []struct {
	suffix string
	factor int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}, {"PiB", 1 << 50},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"PB", 1e15},
	{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40}, {"P", 1 << 50},
	{"B", 1},
}

// parseSize reads a byte count such as "64GiB", "512M" or "1000000": an
// integer, optionally followed by a unit (K, M, G, T, P and their KiB
// forms are powers of 1024; KB, MB, GB, TB, PB powers of 1000).
func parseSize(s string) (int64, error) {
	num, factor := strings.TrimSpace(s), int64(1)
	for _, u := range sizeUnits {
		if rest, ok := strings.CutSuffix(num, u.suffix); ok {
			num, factor = strings.TrimSpace(rest), u.factor
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%q is not a size (an integer with an optional unit: K, M, G, T, KiB, MB, ...)", s)
	}
	if n > math.MaxInt64/factor {
		return 0, fmt.Errorf("%q is too large", s)
	}
	return n * factor, nil
}

// sizeFlag is a pflag.Value holding a byte count given as parseSize reads it.
type sizeFlag struct{ n *int64 }

func (f sizeFlag) String() string {
	if f.n == nil {
		return "0"
	}
	v, unit := scaleBytes(*f.n)
	if unit != "B" && v == float64(int64(v)) {
		return fmt.Sprintf("%d%s", int64(v), unit)
	}
	return strconv.FormatInt(*f.n, 10)
}

func (f sizeFlag) Set(s string) error {
	n, err := parseSize(s)
	if err != nil {
		return err
	}
	*f.n = n
	return nil
}

func (f sizeFlag) Type() string { return "SIZE" }
