package main

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	gwebsocket "github.com/gorilla/websocket"
	"github.com/spf13/cobra"
	"golang.org/x/term"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/transport/websocket"
	kubevirtv1 "kubevirt.io/api/core/v1"
)

// consoleProtocol is the websocket subprotocol of KubeVirt's serial
// console: the serial port's bytes, both ways, in binary messages.
const consoleProtocol = "plain.kubevirt.io"

// escapeByte ends a console session: Ctrl+], as virtctl and telnet have it.
const escapeByte = 0x1d

type consoleOptions struct {
	*globalOptions
	kubeFlags
	network string
}

func newVMConsoleCmd(g *globalOptions) *cobra.Command {
	o := &consoleOptions{globalOptions: g}
	cmd := &cobra.Command{
		Use:   "console NAME",
		Short: "Connect to a running VM's serial console (Ctrl+] to leave)",
		Long: `Connects the terminal to the serial console of a running VM, through the hub's
API server and KubeVirt's console subresource, as virtctl console does. The
terminal is put in raw mode while connected; Ctrl+] ends the session and
leaves the VM running. Standard input that is not a terminal is sent as it
is, and the session ends at its end or at Ctrl+].

Needs get on virtualmachineinstances/console in subresources.kubevirt.io,
which config/tenant grants.`,
		Example: `  imagectl vm console web -n acme
  imagectl vm console web-1 --network frontend`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeArgs(&o.kubeFlags, listVMs),
		RunE:              func(cmd *cobra.Command, args []string) error { return runVMConsole(cmd, o, args[0]) },
	}
	cmd.Flags().StringVar(&o.network, "network", "", "the VM is on this private network of the namespace")
	addKubeFlags(cmd, &o.kubeFlags)
	return cmd
}

func runVMConsole(cmd *cobra.Command, o *consoleOptions, name string) error {
	cfg, ns, err := o.kubeFlags.restConfig(false)
	if err != nil {
		return err
	}
	if o.network != "" {
		kc, _, err := o.kubeFlags.client()
		if err != nil {
			return err
		}
		if _, ns, err = networkNamespace(cmd.Context(), kc, ns, o.network); err != nil {
			return err
		}
	}
	cfg.Timeout = 0 // a session lasts as long as the user wants
	rt, holder, err := websocket.RoundTripperFor(cfg)
	if err != nil {
		return err
	}
	u, err := url.Parse(strings.TrimSuffix(cfg.Host, "/") + cfg.APIPath)
	if err != nil {
		return fmt.Errorf("the hub's address %q: %w", cfg.Host, err)
	}
	u = u.JoinPath("/apis/subresources.kubevirt.io/v1/namespaces", ns, "virtualmachineinstances", name, "console")
	req, err := http.NewRequestWithContext(cmd.Context(), http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	conn, err := websocket.Negotiate(rt, holder, req, consoleProtocol)
	if err != nil {
		// The hub's answer (forbidden, not found, not running) is the cause.
		var up *httpstream.UpgradeFailureError
		if errors.As(err, &up) && up.Cause != nil {
			err = up.Cause
		}
		if apierrors.IsNotFound(err) {
			return notRunning(cmd.Context(), o, ns, name, err)
		}
		return fmt.Errorf("connecting to the console of VM %s/%s: %w", ns, name, err)
	}
	defer conn.Close()
	fmt.Fprintf(cmd.ErrOrStderr(), "Connected to the console of %s/%s; Ctrl+] leaves.\r\n", ns, name)
	err = runConsole(cmd.Context(), conn, cmd.InOrStdin(), cmd.OutOrStdout())
	fmt.Fprint(cmd.ErrOrStderr(), "\r\nDisconnected.\r\n")
	return err
}

// notRunning explains a console refused for want of a running instance:
// the VM is stopped, or there is no such VM.
func notRunning(ctx context.Context, o *consoleOptions, ns, name string, cause error) error {
	kc, _, err := o.kubeFlags.client()
	if err != nil {
		return err
	}
	var vm kubevirtv1.VirtualMachine
	switch err := kc.Get(ctx, ns, name, &vm); {
	case err == nil:
		return fmt.Errorf("VM %s/%s is not running (%s); imagectl vm start %s starts it", ns, name, cmp.Or(string(vm.Status.PrintableStatus), "no instance"), name)
	case apierrors.IsNotFound(err):
		return fmt.Errorf("no VM %s in namespace %s", name, ns)
	}
	return fmt.Errorf("connecting to the console of VM %s/%s: %w", ns, name, cause)
}

// runConsole copies between the terminal and the console until the
// escape byte, the end of input, or the VM's end closes the session. A
// terminal on stdin is in raw mode meanwhile, so that keys reach the VM
// as typed.
func runConsole(ctx context.Context, conn *gwebsocket.Conn, in io.Reader, out io.Writer) error {
	if f, ok := in.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		state, err := term.MakeRaw(int(f.Fd()))
		if err != nil {
			return fmt.Errorf("putting the terminal in raw mode: %w", err)
		}
		defer term.Restore(int(f.Fd()), state)
	}
	fromVM := make(chan error, 1)
	go func() {
		for {
			_, data, err := conn.ReadMessage()
			if err != nil {
				fromVM <- err
				return
			}
			if _, err := out.Write(data); err != nil {
				fromVM <- err
				return
			}
		}
	}()
	toVM := make(chan error, 1)
	go func() { toVM <- copyUntilEscape(conn, in) }()
	var err error
	select {
	case err = <-toVM:
		// Escape, end of input or a write error: close, and show what the
		// VM answered to what was sent until the hub answers the close.
		closeMsg := gwebsocket.FormatCloseMessage(gwebsocket.CloseNormalClosure, "")
		_ = conn.WriteControl(gwebsocket.CloseMessage, closeMsg, time.Now().Add(closeWait))
		_ = conn.SetReadDeadline(time.Now().Add(closeWait))
		<-fromVM
	case err = <-fromVM:
		if gwebsocket.IsCloseError(err, gwebsocket.CloseNormalClosure) {
			err = nil
		}
	case <-ctx.Done():
		err = context.Cause(ctx)
	}
	if errors.Is(err, errEscaped) || errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// closeWait bounds how long a leaving session waits for the hub to answer
// its close.
const closeWait = 5 * time.Second

var errEscaped = errors.New("left with the escape key")

// copyUntilEscape sends what in gives until the escape byte (not sent)
// or the end of input.
func copyUntilEscape(conn *gwebsocket.Conn, in io.Reader) error {
	buf := make([]byte, 4096)
	for {
		n, err := in.Read(buf)
		if n > 0 {
			chunk, escaped := buf[:n], false
			if i := bytes.IndexByte(chunk, escapeByte); i >= 0 {
				chunk, escaped = chunk[:i], true
			}
			if len(chunk) > 0 {
				if werr := conn.WriteMessage(gwebsocket.BinaryMessage, chunk); werr != nil {
					return fmt.Errorf("writing to the console: %w", werr)
				}
			}
			if escaped {
				return errEscaped
			}
		}
		if err != nil {
			return err
		}
	}
}
