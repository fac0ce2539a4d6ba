// Command imagectl is the tenant CLI of imagepipe: it inspects and converts
// untrusted disk images.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/internal/reject"
)

// Exit codes, documented in the README. An interrupted command exits with
// 128 plus the signal's number, as shells report it: 130 for SIGINT
// (Ctrl-C), 143 for SIGTERM.
const (
	exitOK       = 0
	exitError    = 1
	exitRejected = 3
)

func main() {
	ctx, stop := interruptContext()
	err := newRootCmd().ExecuteContext(ctx)
	var intr *interruptedError
	if cause := context.Cause(ctx); err != nil && errors.As(cause, &intr) && !errors.As(err, &intr) {
		err = cause // whatever the command was doing when it was stopped
	}
	stop()
	os.Exit(exitCode(err))
}

// interruptContext is cancelled, with an *interruptedError as its cause,
// at the first SIGINT or SIGTERM; commands then stop and say so. A second
// signal ends the process at once.
func interruptContext() (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case sig := <-sigs:
			cancel(&interruptedError{sig: sig.(syscall.Signal)})
		case <-done:
			return
		}
		select {
		case sig := <-sigs:
			os.Exit(128 + int(sig.(syscall.Signal)))
		case <-done:
		}
	}()
	return ctx, func() {
		signal.Stop(sigs)
		close(done)
		cancel(nil)
	}
}

// interruptedError is the outcome of a command stopped by a signal.
type interruptedError struct {
	sig syscall.Signal
	// resumable says that running the same command again resumes the
	// work (an import's upload) rather than starting over.
	resumable bool
}

func (e *interruptedError) Error() string {
	if e.resumable {
		return "interrupted; run the same command again to resume"
	}
	return "interrupted"
}

// exitCode maps an error to the process exit code and prints it.
func exitCode(err error) int {
	if err == nil {
		return exitOK
	}
	var reported *reportedError
	if errors.As(err, &reported) {
		return reported.code
	}
	fmt.Fprintln(os.Stderr, "imagectl:", err)
	var intr *interruptedError
	if errors.As(err, &intr) {
		return 128 + int(intr.sig)
	}
	if errors.Is(err, registry.ErrResumable) {
		fmt.Fprintln(os.Stderr, "hint: the upload is kept; run the same command again to resume it")
	}
	if re := reject.As(err); re != nil {
		if hint := hintFor(re.Reason); hint != "" {
			fmt.Fprintln(os.Stderr, "hint:", hint)
		}
		return exitRejected
	}
	return exitError
}

// reportedError is an outcome already shown to the user (e.g. a rejection
// printed as part of an inspect report) that only sets the exit code.
type reportedError struct{ code int }

func (e *reportedError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// hintFor suggests what a tenant can do about a rejection.
func hintFor(r reject.Reason) string {
	switch r {
	case reject.BackingFile:
		return "flatten the image first: qemu-img convert -O qcow2 IN OUT"
	case reject.UnsupportedFormat, reject.ExtendedL2:
		return "convert the image to qcow2 or raw first: qemu-img convert -O qcow2 IN OUT"
	case reject.FormatMismatch:
		return "drop --format to let imagectl detect the format, or check that you uploaded the right file"
	case reject.VirtualSize:
		return "raise the limit with --max-virtual-size if the disk really is that large; a qcow2 disk's size must be a multiple of 512 bytes"
	case reject.SharedL2Table, reject.SharedCluster, reject.MetadataOverlap:
		return "qemu-img never writes such tables; rebuild the image from a trusted copy of the disk"
	case reject.CompressionRatio:
		return "convert the disk again without -c, or with -o compression_type=zlib"
	case reject.AmbiguousRaw:
		return "publish the disk as qcow2 (--disk-format qcow2, the default; convert --to qcow2), which names its format"
	case reject.Encrypted:
		return "decrypt the disk before uploading it"
	}
	return ""
}
