package main

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// hubPoll is how often a --wait looks at the hub again.
const hubPoll = time.Second

// pollUntil calls done every hubPoll, with a context that ends after
// timeout, until it returns true or an error; a timeout fails with
// onTimeout.
func pollUntil(ctx context.Context, timeout time.Duration, onTimeout error, done func(ctx context.Context) (bool, error)) error {
	ctx, cancel := context.WithTimeoutCause(ctx, timeout, onTimeout)
	defer cancel()
	for {
		ok, err := done(ctx)
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		if ok || err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(hubPoll):
		}
	}
}

// checkWait checks --wait and --timeout: a positive timeout, given only
// with --wait.
func checkWait(wait bool, timeout time.Duration, timeoutSet bool) error {
	switch {
	case wait && timeout <= 0:
		return &usageError{fmt.Errorf("--timeout %s: want a positive duration such as 90s or 10m", timeout)}
	case !wait && timeoutSet:
		return &usageError{errors.New("--timeout bounds --wait; add --wait")}
	}
	return nil
}
