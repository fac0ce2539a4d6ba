package gate

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"testing/iotest"
)

func TestReadAheadReadsWhatItsSourceHolds(t *testing.T) {
	src := bytes.Repeat([]byte("0123456789abcdef"), 100_000) // several buffers and a part
	a := newReadAhead(iotest.HalfReader(bytes.NewReader(src)))
	got, err := io.ReadAll(iotest.OneByteReader(io.LimitReader(a, 1000)))
	if err != nil || !bytes.Equal(got, src[:1000]) {
		t.Fatalf("first bytes: %v", err)
	}
	rest, err := io.ReadAll(a)
	if err != nil || !bytes.Equal(append(got, rest...), src) {
		t.Fatalf("read %d of %d bytes (%v)", len(got)+len(rest), len(src), err)
	}
	a.Close()
}

func TestReadAheadPassesErrorsAndStopsEarly(t *testing.T) {
	broken := errors.New("connection reset")
	a := newReadAhead(io.MultiReader(bytes.NewReader(make([]byte, 300<<10)), iotest.ErrReader(broken)))
	if _, err := io.ReadAll(a); !errors.Is(err, broken) {
		t.Errorf("got %v, want the source's error", err)
	}
	a.Close()

	// Closed after one read, with the goroutine blocked on full buffers.
	a = newReadAhead(bytes.NewReader(make([]byte, 10<<20)))
	a.Read(make([]byte, 10))
	a.Close()
}
