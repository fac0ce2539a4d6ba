// Command image-gate is the server side's one check of what tenants push:
// it learns of pushed images from registry webhooks and from polling,
// reads each pushed digest in full, publishes its canonical containerDisk
// in the same repository and attaches a verdict signed with the provider's
// key, which every hub's image-syncer requires before it imports anything.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRootCmd().ExecuteContext(ctx)
	stop()
	if err != nil {
		if !errors.As(err, new(loggedError)) {
			fmt.Fprintln(os.Stderr, "image-gate:", err)
		}
		os.Exit(1)
	}
}
