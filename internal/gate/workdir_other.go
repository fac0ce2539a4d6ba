//go:build !unix

package gate

import (
	"errors"
	"os"
)

// lockWorkDir cannot lock a folder here: errors.ErrUnsupported, so that
// no folder is taken for a dead gate's.
func lockWorkDir(string) (*os.File, error) { return nil, errors.ErrUnsupported }
