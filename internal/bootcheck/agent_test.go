package bootcheck

import (
	"bufio"
	"encoding/json"
	"errors"
	"net"
	"strings"
	"testing"
	"time"
)

// agentPeer plays the guest's end of the agent's port: reply gets each
// request line and writes what the guest answers.
func agentPeer(t *testing.T, reply func(req map[string]any, w net.Conn)) net.Conn {
	t.Helper()
	host, guest := net.Pipe()
	t.Cleanup(func() { host.Close(); guest.Close() })
	go func() {
		r := bufio.NewReader(guest)
		for {
			line, err := r.ReadBytes('\n')
			if err != nil {
				return
			}
			var req map[string]any
			if json.Unmarshal(line, &req) != nil {
				return
			}
			reply(req, guest)
		}
	}()
	return host
}

// TestSyncAgentWaitsForItsOwnAnswer: the answer to this guest-sync ends
// the wait; a stale answer, noise and an over-long line do not.
func TestSyncAgentWaitsForItsOwnAnswer(t *testing.T) {
	conn := agentPeer(t, func(req map[string]any, w net.Conn) {
		id := req["arguments"].(map[string]any)["id"]
		_, _ = w.Write([]byte("{\"return\": 6}\n" + strings.Repeat("z", 8<<10) + "\nnot json\n"))
		b, _ := json.Marshal(map[string]any{"return": id})
		_, _ = w.Write(append(b, '\n'))
	})
	if err := SyncAgent(t.Context(), conn, 7, 10*time.Second); err != nil {
		t.Fatalf("SyncAgent: %v; want the agent's answer to id 7", err)
	}
}

// TestSyncAgentBoundsAHostileGuest: a guest that never answers, or
// answers with endless output, costs the timeout or maxAgentReply bytes.
func TestSyncAgentBoundsAHostileGuest(t *testing.T) {
	silent := agentPeer(t, func(map[string]any, net.Conn) {})
	if err := SyncAgent(t.Context(), silent, 1, 200*time.Millisecond); !errors.Is(err, ErrNoAgentReply) {
		t.Errorf("a silent guest: %v; want ErrNoAgentReply", err)
	}
	flood := &countingConn{Conn: agentPeer(t, func(_ map[string]any, w net.Conn) {
		line := []byte(`{"return": 0}` + "\n")
		for {
			if _, err := w.Write(line); err != nil {
				return
			}
		}
	})}
	if err := SyncAgent(t.Context(), flood, 1, time.Minute); !errors.Is(err, ErrNoAgentReply) {
		t.Errorf("a flooding guest: %v; want ErrNoAgentReply once %d bytes are read", err, maxAgentReply)
	}
	if flood.read > maxAgentReply {
		t.Errorf("read %d bytes of the flood; want at most %d", flood.read, maxAgentReply)
	}
}

// countingConn counts the bytes read through it.
type countingConn struct {
	net.Conn
	read int
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.read += n
	return n, err
}
