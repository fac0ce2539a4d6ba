// Command imagectl is the tenant CLI of imagepipe: it inspects and converts
// untrusted disk images.
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/imagepipe/imagepipe/internal/catalog"
	"github.com/imagepipe/imagepipe/internal/imageref"
	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/internal/reject"
	"github.com/imagepipe/imagepipe/pkg/api"
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
	root := newRootCmd()
	cmd, err := root.ExecuteContextC(ctx)
	var intr *interruptedError
	if cause := context.Cause(ctx); err != nil && errors.As(cause, &intr) && !errors.As(err, &intr) {
		err = cause // whatever the command was doing when it was stopped
	}
	stop()
	os.Exit(report(cmd, err))
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

// report tells the user how cmd ended and returns the exit code: the
// error and a hint on standard error and, when cmd was asked for -o json
// or yaml, the error object (api.Failure) on standard output too.
func report(cmd *cobra.Command, err error) int {
	if err == nil {
		return exitOK
	}
	var reported *reportedError
	if errors.As(err, &reported) {
		return reported.code
	}
	f := describe(err)
	fmt.Fprintln(os.Stderr, "imagectl:", f.Message)
	if f.Hint != "" {
		fmt.Fprintln(os.Stderr, "hint:", f.Hint)
	}
	var shown *shownError
	if cmd != nil && !errors.As(err, &shown) {
		if o := cmd.Flags().Lookup("output"); o != nil {
			out := &outputFlags{format: outputFormat(o.Value.String())}
			if !out.machine() {
				return f.ExitCode
			}
			if perr := out.print(cmd.OutOrStdout(), api.Failure{Error: f}, nil); perr != nil {
				fmt.Fprintln(os.Stderr, "imagectl: printing the error object:", perr)
			}
		}
	}
	return f.ExitCode
}

// describe sorts an error into its reason code, exit code and hint.
func describe(err error) api.FailureDetail {
	f := api.FailureDetail{Code: "error", Message: err.Error(), ExitCode: exitError}
	var intr *interruptedError
	var usage *usageError
	switch re := reject.As(err); {
	case errors.As(err, &intr):
		f.Code, f.ExitCode, f.Resumable = "interrupted", 128+int(intr.sig), intr.resumable
	case re != nil:
		f.Code, f.ExitCode, f.Hint = string(re.Reason), exitRejected, hintFor(re.Reason)
	case errors.As(err, &usage), imageref.AsError(err) != nil:
		f.Code = "usage"
	case errors.Is(err, errUnauthorized):
		f.Code = "unauthorized"
	case errors.Is(err, errDenied):
		f.Code = "denied"
	case errors.Is(err, errNotFound), errors.Is(err, catalog.ErrNotFound):
		f.Code = "not-found"
	case errors.Is(err, errUnreachable), unreachableHub(err):
		f.Code = "unreachable"
	// The hub's answers (vm, volume).
	case apierrors.IsNotFound(err):
		f.Code = "not-found"
	case apierrors.IsForbidden(err):
		f.Code = "denied"
	case apierrors.IsUnauthorized(err):
		f.Code = "unauthorized"
	}
	var hinted *hintedError
	if errors.As(err, &hinted) {
		f.Hint = hinted.hint
	}
	if errors.Is(err, registry.ErrResumable) {
		f.Resumable = true
		if !strings.Contains(f.Message, "resume") {
			f.Hint = "the upload is kept; run the same command again to resume it"
		}
	}
	return f
}

// unreachableHub reports whether err is a failed connection (refused, no
// route, no such host), as client-go returns when the hub is down.
func unreachableHub(err error) bool {
	var dnsErr *net.DNSError
	var opErr *net.OpError
	return errors.As(err, &dnsErr) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EHOSTUNREACH) ||
		(errors.As(err, &opErr) && opErr.Op == "dial")
}

// shownError is an error whose command already printed its outcome on
// standard output (a rejection report), so no error object follows.
type shownError struct{ err error }

func (e *shownError) Error() string { return e.err.Error() }
func (e *shownError) Unwrap() error { return e.err }

// hintedError is an error with a suggestion of what to do about it.
type hintedError struct {
	err  error
	hint string
}

func (e *hintedError) Error() string { return e.err.Error() }
func (e *hintedError) Unwrap() error { return e.err }

// usageError is a command line imagectl cannot run: an unknown flag or
// command, a wrong number of arguments, a flag value out of range.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

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
	case reject.PlatformMismatch:
		return "name a platform the image holds with --platform, or publish the disk for this one: imagectl import --platform OS/ARCH --append DISK REF"
	}
	return ""
}
