package registry

import (
	"crypto/sha256"
	"fmt"
	"os"
	"testing"
	"time"
)

// waitABit pauses a polling loop; it times nothing.
func waitABit() { time.Sleep(20 * time.Millisecond) }

const sha256Zero = "0000000000000000000000000000000000000000000000000000000000000000"

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

func sha256File(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", sha256.Sum256(b))
}
