package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// interrupted returns err, or, when ctx was stopped by a signal, the
// interruption, saying whether running the command again resumes.
func interrupted(ctx context.Context, err error, resumable bool) error {
	var intr *interruptedError
	if errors.As(context.Cause(ctx), &intr) {
		return &interruptedError{sig: intr.sig, resumable: resumable}
	}
	return err
}

// localUploadName names the upload of a local file by its path, device,
// inode, size and modification and change times, so that an import
// interrupted before the file's digest was known still resumes in a later
// run. Any write to the file changes its change time, and so the name; a
// name that still matched other content would only cost a fresh upload,
// since the registry checks the layer's digest. Other sources ("-",
// URLs) have their digest before the upload starts and need no name.
func localUploadName(spec string) string {
	if spec == "-" || strings.Contains(spec, "://") {
		return ""
	}
	abs, err := filepath.Abs(spec)
	if err != nil {
		return ""
	}
	st, err := os.Stat(abs)
	if err != nil || !st.Mode().IsRegular() {
		return ""
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return ""
	}
	return fmt.Sprintf("file:%s:%d:%d:%d:%d:%d", abs, sys.Dev, sys.Ino, st.Size(), st.ModTime().UnixNano(), sys.Ctim.Nano())
}
