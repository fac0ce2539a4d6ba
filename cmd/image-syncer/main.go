// Command image-syncer replicates tenant images from the central registry
// onto one hub cluster: it learns of images from registry webhooks and from
// polling, revalidates them, and makes each a BaseImage with a digest-pinned
// CDI DataVolume and a DataSource VMs clone from.
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
		// Once logging is set up, run logs its error itself, in the log
		// format; errors in the flags come before that and are plain text.
		if !errors.As(err, new(loggedError)) {
			fmt.Fprintln(os.Stderr, "image-syncer:", err)
		}
		os.Exit(1)
	}
}
