// Package secretfile reads the small files a daemon is configured with (a
// webhook token, a key, a docker config): bounded, and never empty.
package secretfile

import (
	"bytes"
	"fmt"
	"io"
	"os"
)

// MaxSize bounds a file Read reads: 64 KiB.
const MaxSize = 64 << 10

// Read reads path: at most MaxSize bytes, not empty (blank counts as
// empty).
func Read(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxSize+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	if len(data) > MaxSize {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, MaxSize)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, fmt.Errorf("%s is empty", path)
	}
	return data, nil
}
