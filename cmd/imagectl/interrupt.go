package main

import (
	"context"
	"errors"
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
