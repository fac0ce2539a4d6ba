package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// The request timeouts of every endpoint: a client that sends its headers
// or body slowly, or keeps an idle connection, cannot hold it for long.
// Webhook bodies are bounded and small; metrics and health have none.
const (
	readHeaderTimeout = 10 * time.Second
	readTimeout       = 30 * time.Second
	idleTimeout       = 2 * time.Minute
)

// Server is one HTTP endpoint of a daemon: the webhook, metrics or health.
type Server struct {
	// Name says what it serves ("webhook"), in its log line and errors.
	Name string
	// Addr is the address to listen on, as net.Listen takes it.
	Addr    string
	Handler http.Handler
	// ShutdownTimeout bounds how long requests in flight may finish once
	// the context ends; past it they are cut off.
	ShutdownTimeout time.Duration
	// Logger gets the address listened on; nil discards.
	Logger *slog.Logger
}

// Run serves until ctx ends, then shuts down gracefully and returns nil. It
// returns an error when it cannot listen or the server stops by itself.
func (s *Server) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.Addr)
	if err != nil {
		return fmt.Errorf("listening on %s for the %s: %w", s.Addr, s.Name, err)
	}
	srv := &http.Server{Handler: s.Handler, ReadHeaderTimeout: readHeaderTimeout, ReadTimeout: readTimeout, IdleTimeout: idleTimeout}
	stopped := make(chan error, 1)
	go func() { stopped <- srv.Serve(ln) }()
	log := orDiscard(s.Logger)
	log.Info("listening", "endpoint", s.Name, "address", ln.Addr().String())
	select {
	case err := <-stopped:
		return fmt.Errorf("serving the %s: %w", s.Name, err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.ShutdownTimeout)
	defer cancel()
	err = srv.Shutdown(sctx)
	if errors.Is(err, context.DeadlineExceeded) {
		log.Warn("requests still in flight at the shutdown timeout were cut off", "endpoint", s.Name)
		return nil
	}
	return err
}

func orDiscard(log *slog.Logger) *slog.Logger {
	if log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return log
}
