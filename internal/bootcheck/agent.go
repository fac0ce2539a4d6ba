package bootcheck

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// AgentChannel is the name of the virtio-serial port the QEMU guest agent
// listens on; KubeVirt gives every VM this port, and Debian's
// qemu-guest-agent unit starts when it appears.
const AgentChannel = "org.qemu.guest_agent.0"

// AgentArgs are the QEMU arguments that give the guest the agent's port,
// its host end a listening Unix socket at path, as virt-launcher does.
func AgentArgs(path string) []string {
	return []string{
		"-device", "virtio-serial-pci,id=agent-serial",
		"-chardev", "socket,id=agent0,path=" + path + ",server=on,wait=off",
		"-device", "virtserialport,bus=agent-serial.0,chardev=agent0,name=" + AgentChannel,
	}
}

// maxAgentReply bounds what one guest-sync reads from the guest: an agent
// answers in a few bytes, a hostile guest may write without end.
const maxAgentReply = 64 << 10

// ErrNoAgentReply says the guest did not answer guest-sync before the
// attempt's deadline.
var ErrNoAgentReply = errors.New("the guest agent did not answer")

// SyncAgent asks the guest agent behind conn to echo id (guest-sync) and
// waits until it does, until ctx ends or timeout passes. Lines that are
// not the answer (a stale reply, a guest's noise) are skipped, within
// maxAgentReply bytes in all.
func SyncAgent(ctx context.Context, conn net.Conn, id int64, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if err := conn.SetDeadline(deadline); err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	defer stop()
	req, _ := json.Marshal(map[string]any{"execute": "guest-sync", "arguments": map[string]int64{"id": id}})
	if _, err := conn.Write(append(req, '\n')); err != nil {
		return fmt.Errorf("writing to the guest agent: %w", err)
	}
	r := bufio.NewReader(io.LimitReader(conn, maxAgentReply))
	for {
		line, err := r.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			for errors.Is(err, bufio.ErrBufferFull) {
				_, err = r.ReadSlice('\n')
			}
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, io.EOF) {
				return ErrNoAgentReply
			}
			return fmt.Errorf("reading from the guest agent: %w", err)
		}
		var reply struct {
			Return *int64 `json:"return"`
		}
		if json.Unmarshal(line, &reply) == nil && reply.Return != nil && *reply.Return == id {
			return nil
		}
	}
}

// WaitAgent waits until the guest agent behind the Unix socket at path
// echoes a guest-sync, asking every few seconds (and dialling again when
// QEMU, which makes the socket as it starts, is not listening yet), and
// returns nil then, or ctx's error when it ends first.
func WaitAgent(ctx context.Context, path string) error {
	var d net.Dialer
	for id := int64(1); ctx.Err() == nil; id++ {
		conn, err := d.DialContext(ctx, "unix", path)
		if err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		for ; ctx.Err() == nil; id++ {
			err := SyncAgent(ctx, conn, id, 5*time.Second)
			if err == nil {
				conn.Close()
				return nil
			}
			if !errors.Is(err, ErrNoAgentReply) {
				break // QEMU closed the socket: dial again
			}
		}
		conn.Close()
	}
	return ctx.Err()
}
