package daemon

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// start runs s until ctx ends and returns the address it listens on, read
// from its log line, and what Run returns.
func start(ctx context.Context, t *testing.T, s *Server) (addr string, done <-chan error) {
	t.Helper()
	logs, w := io.Pipe()
	s.Logger = slog.New(slog.NewJSONHandler(w, nil))
	result := make(chan error, 1)
	go func() {
		result <- s.Run(ctx)
		w.Close()
	}()
	lines := bufio.NewScanner(logs)
	for lines.Scan() {
		var rec struct{ Msg, Address string }
		if json.Unmarshal(lines.Bytes(), &rec) == nil && rec.Msg == "listening" {
			go func() { _, _ = io.Copy(io.Discard, logs) }()
			return rec.Address, result
		}
	}
	t.Fatalf("the server did not log its address: %v", <-result)
	return "", nil
}

// A request in flight when the daemon stops is answered; then Run returns nil.
func TestServerShutsDownGracefully(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		close(entered)
		<-release
		_, _ = io.WriteString(w, "done")
	})
	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	addr, done := start(ctx, t, &Server{Name: "webhook", Addr: "127.0.0.1:0", Handler: h, ShutdownTimeout: time.Minute})
	answer := make(chan string, 1)
	go func() {
		resp, err := http.Get("http://" + addr + "/")
		if err != nil {
			answer <- err.Error()
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		answer <- string(b)
	}()
	<-entered
	stop()
	// Shutting down closes the listener first; the request is then let go.
	for deadline := time.Now().Add(10 * time.Second); ; {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			break
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatal("still listening 10 s after the context ended")
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	if got := <-answer; got != "done" {
		t.Errorf("the request in flight got %q, want done", got)
	}
	if err := <-done; err != nil {
		t.Errorf("Run after a graceful shutdown: %v", err)
	}
}

// An address in use is an error naming the endpoint, not a silent exit.
func TestServerCannotListen(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	s := &Server{Name: "metrics", Addr: ln.Addr().String(), Handler: http.NotFoundHandler()}
	if err := s.Run(t.Context()); err == nil || !strings.Contains(err.Error(), "for the metrics") {
		t.Errorf("error %v, want one naming the metrics endpoint", err)
	}
}
