package harness

import (
	"errors"
	"io"
	"net"
	"sync"
)

// CutProxy is a TCP proxy on 127.0.0.1 that cuts client connections at chosen byte offsets, to
// test how a client survives a transfer interrupted at a known point.
type CutProxy struct {
	Addr string // 127.0.0.1:PORT

	target string
	ln     net.Listener
	wg     sync.WaitGroup // the accept loop and every connection's copiers

	mu        sync.Mutex // guards everything below
	cutAt     []int64    // offsets not yet reached
	forwarded int64
	cuts      int
	pairs     map[*pair]struct{} // open connections; nil once the proxy has stopped
}

// StartCutProxy forwards TCP connections to target. It counts the bytes clients send (all
// connections together, in order); when the running total crosses each offset in cutAt
// (ascending), it closes both sides of the connection carrying that byte, after forwarding exactly
// up to the offset. It reports how many client bytes it forwarded in total.
//
// "Crossing" offset N means a client sends byte N+1: a connection that sends exactly N bytes in
// all is not cut, and the next byte any connection sends is. Equal offsets cut one connection
// each. Bytes from the target to clients are forwarded uncounted. The proxy stops, closing every
// connection, when the test ends.
func StartCutProxy(t T, target string, cutAt ...int64) *CutProxy {
	t.Helper()
	for i := 1; i < len(cutAt); i++ {
		if cutAt[i] < cutAt[i-1] {
			t.Fatalf("StartCutProxy: offsets %v are not ascending", cutAt)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("starting cut proxy: %v", err)
	}
	p := &CutProxy{
		Addr:   ln.Addr().String(),
		target: target,
		ln:     ln,
		cutAt:  append([]int64(nil), cutAt...),
		pairs:  make(map[*pair]struct{}),
	}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		p.ln.Close()
		p.mu.Lock()
		for c := range p.pairs {
			p.closeLocked(c)
		}
		p.pairs = nil
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

// Forwarded is how many client bytes the proxy has passed to the target, over all connections.
func (p *CutProxy) Forwarded() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.forwarded
}

// Cuts is how many connections the proxy has cut.
func (p *CutProxy) Cuts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cuts
}

// pair is one proxied connection: the client's side and the target's.
type pair struct {
	client, upstream net.Conn
	halfClosed       int // directions that ended cleanly; at 2 the pair is closed
}

func (p *CutProxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return // listener closed: the test is over
		}
		upstream, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		c := &pair{client: client, upstream: upstream}
		p.mu.Lock()
		if p.pairs == nil { // stopping
			p.mu.Unlock()
			client.Close()
			upstream.Close()
			return
		}
		p.pairs[c] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.forwardClient(c)
		go p.forwardTarget(c)
	}
}

// forwardClient copies client bytes to the target, counting them and cutting at the offsets.
func (p *CutProxy) forwardClient(c *pair) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := c.client.Read(buf)
		if n > 0 && !p.forward(c, buf[:n]) {
			return
		}
		if err != nil {
			// The client finished sending, or the pair was closed: pass a half-close on so the
			// target can still answer.
			p.halfClose(c, c.upstream, err)
			return
		}
	}
}

// forward passes chunk on, up to the next cut offset. It reports false when it cut the
// connection or the target went away. The bytes are counted before they are written, outside the
// lock so a stalled target cannot block other connections or the proxy's stop; a short write
// takes back what did not go through.
func (p *CutProxy) forward(c *pair, chunk []byte) bool {
	p.mu.Lock()
	cut := false
	if len(p.cutAt) > 0 {
		if room := p.cutAt[0] - p.forwarded; int64(len(chunk)) > room {
			chunk = chunk[:max(room, 0)]
			cut = true
			p.cutAt = p.cutAt[1:]
			p.cuts++
		}
	}
	p.forwarded += int64(len(chunk))
	p.mu.Unlock()

	n, err := c.upstream.Write(chunk)
	if cut || err != nil {
		p.mu.Lock()
		p.forwarded -= int64(len(chunk) - n)
		p.closeLocked(c)
		p.mu.Unlock()
		return false
	}
	return true
}

// forwardTarget copies the target's bytes back to the client, uncounted.
func (p *CutProxy) forwardTarget(c *pair) {
	defer p.wg.Done()
	_, err := io.Copy(c.client, c.upstream)
	p.halfClose(c, c.client, err)
}

// halfClose ends one direction of c, whose copy ended with err (nil or io.EOF when the sender
// finished). A clean end shuts only the write side of dst so the other direction can go on; the
// pair is closed once both directions have ended, or at once after an error.
func (p *CutProxy) halfClose(c *pair, dst net.Conn, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, open := p.pairs[c]; !open {
		return
	}
	if err != nil && !errors.Is(err, io.EOF) {
		p.closeLocked(c)
		return
	}
	if cw, ok := dst.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	c.halfClosed++
	if c.halfClosed == 2 {
		p.closeLocked(c)
	}
}

// closeLocked closes both sides of c; p.mu is held.
func (p *CutProxy) closeLocked(c *pair) {
	c.client.Close()
	c.upstream.Close()
	delete(p.pairs, c)
}
