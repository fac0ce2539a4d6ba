package main

import "testing"

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{
		"0": 0, "4096": 4096, "64GiB": 64 << 30, "64G": 64 << 30, "512M": 512 << 20,
		"1 TiB": 1 << 40, "10GB": 10e9, "7B": 7, "8EiB": -1, "-1": -1, "1.5G": -1, "": -1, "G": -1,
		"9223372036854775807": 1<<63 - 1, "8388608TiB": -1,
	} {
		got, err := parseSize(in)
		if want < 0 {
			if err == nil {
				t.Errorf("parseSize(%q) = %d, want an error", in, got)
			}
			continue
		}
		if err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	n := int64(64 << 30)
	if s := (sizeFlag{&n}).String(); s != "64GiB" {
		t.Errorf("String() = %q", s)
	}
}
