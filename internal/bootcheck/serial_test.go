package bootcheck

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"testing/iotest"
)

// TestReadLinesSeesPromptsAndKeepsItsBounds: a login prompt without its
// line end is seen, long lines are cut, and output past the limit ends
// the reading with errSerialLimit.
func TestReadLinesSeesPromptsAndKeepsItsBounds(t *testing.T) {
	read := func(in string, limit int64) ([]serialLine, error) {
		lines := make(chan serialLine)
		errc := make(chan error, 1)
		go func() { errc <- readLines(iotest.OneByteReader(strings.NewReader(in)), limit, lines) }()
		var got []serialLine
		for l := range lines {
			got = append(got, l)
		}
		return got, <-errc
	}
	got, err := read("Booting\r\ndebian login: ", 1<<20)
	if err != nil || !slices.Contains(got, serialLine{text: "Booting"}) || got[len(got)-1] != (serialLine{text: "debian login: ", partial: true}) {
		t.Errorf("lines %+v, %v; want Booting, then the prompt as a partial line", got, err)
	}
	if !DefaultSignals[1].MatchString(got[len(got)-1].text) {
		t.Errorf("the login signal does not match %q", got[len(got)-1].text)
	}
	got, err = read(strings.Repeat("x", 3*maxLine)+"\nnext\n", 1<<20)
	if err != nil || len(got[len(got)-1].text) != 4 || !slices.ContainsFunc(got, func(l serialLine) bool { return !l.partial && len(l.text) == maxLine }) {
		t.Errorf("a long line: %d lines, %v; want it cut at %d", len(got), err, maxLine)
	}
	got, err = read("0123456789\n", 5)
	if !errors.Is(err, errSerialLimit) || slices.ContainsFunc(got, func(l serialLine) bool { return len(l.text) > 5 }) {
		t.Errorf("past the limit: %+v, %v; want errSerialLimit and no more than 5 bytes", got, err)
	}
}
