package harness

import (
	"io"
	"net"
	"sync"
)

// PauseProxy is a TCP proxy on 127.0.0.1 that stops forwarding client bytes at a chosen offset
// and holds the connection open, so that a test can act (e.g. send the client a signal) while
// the client is known to be mid-transfer, without timing anything.
type PauseProxy struct {
	Addr string // 127.0.0.1:PORT

	target  string
	ln      net.Listener
	wg      sync.WaitGroup
	reached chan struct{} // closed when the offset is reached

	mu        sync.Mutex // guards everything below
	pauseAt   int64      // -1 once the pause is over
	forwarded int64
	held      []net.Conn        // both sides of the paused connection
	conns     map[net.Conn]bool // every open connection, to close at the end
}

// StartPauseProxy forwards TCP connections to target. It counts the bytes clients send (all
// connections together); the connection carrying byte pauseAt+1 forwards exactly up to pauseAt
// and then stops reading from its client, which soon blocks; Reached is closed at that moment.
// Bytes from the target to clients are forwarded uncounted. The proxy stops when the test ends.
func StartPauseProxy(t T, target string, pauseAt int64) *PauseProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("starting pause proxy: %v", err)
	}
	p := &PauseProxy{Addr: ln.Addr().String(), target: target, ln: ln, reached: make(chan struct{}),
		pauseAt: pauseAt, conns: map[net.Conn]bool{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		p.ln.Close()
		p.mu.Lock()
		for c := range p.conns {
			c.Close()
		}
		p.conns = nil
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

// Reached is closed once the clients have sent pauseAt bytes and the proxy holds the rest.
func (p *PauseProxy) Reached() <-chan struct{} { return p.reached }

// Forwarded is how many client bytes the proxy has passed to the target.
func (p *PauseProxy) Forwarded() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.forwarded
}

// Drop closes both sides of the paused connection, dropping what it held, and forwards
// everything from then on.
func (p *PauseProxy) Drop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.held {
		c.Close()
	}
	p.held = nil
	p.pauseAt = -1
}

func (p *PauseProxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		upstream, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		p.mu.Lock()
		if p.conns == nil {
			p.mu.Unlock()
			client.Close()
			upstream.Close()
			return
		}
		p.conns[client], p.conns[upstream] = true, true
		p.mu.Unlock()
		p.wg.Add(2)
		go func() {
			defer p.wg.Done()
			p.forwardClient(client, upstream)
		}()
		go func() {
			defer p.wg.Done()
			io.Copy(client, upstream)
			client.Close()
		}()
	}
}

// forwardClient copies client bytes to upstream until the pause offset, then holds.
func (p *PauseProxy) forwardClient(client, upstream net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := client.Read(buf)
		chunk := buf[:n]
		p.mu.Lock()
		pause := false
		if p.pauseAt >= 0 && p.forwarded+int64(len(chunk)) > p.pauseAt {
			chunk = chunk[:p.pauseAt-p.forwarded]
			pause = true
		}
		p.forwarded += int64(len(chunk))
		p.mu.Unlock()
		if _, werr := upstream.Write(chunk); werr != nil {
			upstream.Close()
			return
		}
		if pause {
			p.mu.Lock()
			p.held = append(p.held, client, upstream)
			p.pauseAt = -1 // other connections go through
			p.mu.Unlock()
			close(p.reached)
			return // nothing more is read from this client; Drop closes both sides
		}
		if err != nil {
			upstream.Close()
			return
		}
	}
}
