package testenv

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy forwards TCP connections from a local port to a server. It can cut
// a connection at a chosen moment, to inject connection loss. It can turn
// into a black hole (BlackHole): a partition whose connections stay open.
type Proxy struct {
	Addr string // where clients connect

	mu sync.Mutex
	// cutAfter, when set, sees every chunk a client sends; when it returns
	// true the chunk is forwarded to the server and the connection is cut
	// before the server's reply reaches the client.
	cutAfter func(chunk []byte) bool
	// cutLate is cutAfter's delay for LoseReplyAfter (zero for CutAfter).
	cutLate time.Duration
	cuts    int
	down    bool
	observe func(chunk []byte)
	ln      net.Listener
	target  string
	open    map[net.Conn]struct{} // both ends of every open connection
	// hole is non-nil while the proxy is a black hole; it is closed when
	// the black hole ends.
	hole chan struct{}
	// holdIf, when set, sees every chunk a client sends; a chunk for which
	// it returns true is held, with everything its connection sends after
	// it, until ReleaseHeld (see Hold).
	holdIf func(chunk []byte) bool
	held   []*heldConn // connections holding chunks, in the order they began
}

// heldConn is one connection's state for Hold; its fields are guarded by
// Proxy.mu.
type heldConn struct {
	server     net.Conn
	chunks     [][]byte // held, not yet forwarded
	holding    bool
	clientGone bool         // the client closed or failed while holding
	replies    atomic.Int64 // bytes the server sent so far
	closeBoth  func()
}

// StartProxy forwards a free loopback port to target until the test ends.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{Addr: ln.Addr().String(), ln: ln, target: target, open: map[net.Conn]struct{}{}}
	t.Cleanup(func() {
		ln.Close()
		p.BlackHole(false) // let the forwarders see their connections close
		p.mu.Lock()
		held := p.held
		p.held = nil
		p.mu.Unlock()
		for _, h := range held {
			h.closeBoth()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			down, target := p.down, p.target
			p.mu.Unlock()
			if down {
				c.Close()
				continue
			}
			go p.serve(c, target)
		}
	}()
	return p
}

// CutAfter arms the proxy: the first client chunk for which match returns
// true is forwarded, and then its connection is cut before any reply. It
// disarms itself after one cut.
func (p *Proxy) CutAfter(match func(chunk []byte) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cutAfter = match
}

// LoseReplyAfter arms the proxy as CutAfter does, for a connection that
// carries several calls at once (HTTP/2). The first client chunk for which
// match returns true is forwarded. From then on every byte the server sends
// on that connection is dropped, and the connection is cut after wait. So
// the server has the request for wait, with its connection open, and its
// reply is lost. That holds whatever other frames (a ping's answer) come
// first. It disarms itself after one cut.
func (p *Proxy) LoseReplyAfter(match func(chunk []byte) bool, wait time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cutAfter, p.cutLate = match, wait
}

// SetDown makes the proxy close every new connection at once while down is
// true, as a server that went away would. Connections already open are not
// affected (cut them with CutAfter).
func (p *Proxy) SetDown(down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = down
}

// Observe makes the proxy call f with every chunk a client sends, before
// forwarding it (nil stops). f runs under the proxy's lock: it must not
// block or call the proxy.
func (p *Proxy) Observe(f func(chunk []byte)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.observe = f
}

// Retarget sends new connections to target from now on. It closes every
// connection open through the proxy, as clients that follow a failover to a
// new primary do.
func (p *Proxy) Retarget(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = target
	for c := range p.open {
		c.Close()
	}
}

// BlackHole makes the proxy, while on is true, stop reading from and
// writing to every connection, open or new. It closes none. Bytes already
// sent are neither delivered nor refused. The peers' socket buffers and
// flow-control windows fill, and writes then block, as over a network that
// drops every packet. New connections are accepted (the kernel does so
// anyway) and left silent. Turning it off forwards what was held and
// resumes.
func (p *Proxy) BlackHole(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case on && p.hole == nil:
		p.hole = make(chan struct{})
	case !on && p.hole != nil:
		close(p.hole)
		p.hole = nil
	}
}

// pass returns when the proxy is not a black hole.
func (p *Proxy) pass() {
	p.mu.Lock()
	hole := p.hole
	p.mu.Unlock()
	if hole != nil {
		<-hole
	}
}

// Hold arms the proxy to hold requests, as a network path (or a stopped
// server's socket buffer) that delivers them late. The first client chunk
// of a connection for which match returns true waits in the proxy until
// ReleaseHeld. So does every chunk that connection sends after it. The
// server's replies still pass. A client that gives up and closes a holding
// connection does not close the server's side. What it sent is still
// delivered, late, as a server would still execute it. Hold(nil) holds no
// new connection; those already holding stay held.
func (p *Proxy) Hold(match func(chunk []byte) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.holdIf = match
}

// Held returns how many connections are holding chunks.
func (p *Proxy) Held() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.held)
}

// ReleaseHeld forwards what every holding connection held, one connection
// at a time in the order they began holding. After each it waits for the
// server's first reply to it. So the server has executed a connection's
// requests before the next connection's are sent. A connection whose client
// has gone is closed after that reply. It fails if a server sends nothing
// back within timeout.
func (p *Proxy) ReleaseHeld(timeout time.Duration) error {
	p.mu.Lock()
	held := p.held
	p.held = nil
	p.mu.Unlock()
	for _, h := range held {
		p.mu.Lock()
		before := h.replies.Load()
		var werr error
		for _, c := range h.chunks {
			if _, err := h.server.Write(c); err != nil {
				werr = err
				break
			}
		}
		h.chunks, h.holding = nil, false
		gone := h.clientGone
		p.mu.Unlock()
		if werr != nil {
			h.closeBoth()
			return fmt.Errorf("testenv: proxy: forwarding held chunks: %w", werr)
		}
		deadline := time.Now().Add(timeout)
		for h.replies.Load() == before {
			if time.Now().After(deadline) {
				h.closeBoth()
				return fmt.Errorf("testenv: proxy: no reply within %v to held chunks", timeout)
			}
			time.Sleep(time.Millisecond)
		}
		if gone {
			h.closeBoth()
		}
	}
	return nil
}

// holding reports whether h holds chunks; if it does and gone, it
// records that the client has gone.
func (p *Proxy) holding(h *heldConn, gone bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if h.holding && gone {
		h.clientGone = true
	}
	return h.holding
}

// Cuts returns how many connections the proxy has cut.
func (p *Proxy) Cuts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cuts
}

func (p *Proxy) serve(client net.Conn, target string) {
	p.pass()
	server, err := net.Dial("tcp", target)
	if err != nil {
		client.Close()
		return
	}
	var once sync.Once
	cut := make(chan struct{})
	var mute atomic.Bool // LoseReplyAfter matched: drop the server's bytes
	p.mu.Lock()
	p.open[client], p.open[server] = struct{}{}, struct{}{}
	p.mu.Unlock()
	closeBoth := func() {
		once.Do(func() {
			client.Close()
			server.Close()
			p.mu.Lock()
			delete(p.open, client)
			delete(p.open, server)
			p.mu.Unlock()
		})
	}
	h := &heldConn{server: server, closeBoth: closeBoth}
	go func() { // server -> client, unless cut
		buf := make([]byte, 64<<10)
		for {
			p.pass()
			n, err := server.Read(buf)
			p.pass()
			select {
			case <-cut:
				closeBoth()
				return
			default:
			}
			if n > 0 && !mute.Load() {
				h.replies.Add(int64(n))
				if _, werr := client.Write(buf[:n]); werr != nil && !p.holding(h, true) {
					closeBoth()
					return
				}
			}
			if err != nil {
				closeBoth()
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		p.pass()
		n, err := client.Read(buf)
		p.pass()
		if n > 0 {
			p.mu.Lock()
			if p.observe != nil {
				p.observe(buf[:n])
			}
			armed := p.cutAfter != nil && p.cutAfter(buf[:n])
			if armed {
				p.cutAfter = nil
				p.cuts++
				if p.cutLate > 0 {
					mute.Store(true)
					time.AfterFunc(p.cutLate, closeBoth)
				} else {
					close(cut)
				}
			}
			if h.holding || (p.holdIf != nil && p.holdIf(buf[:n])) {
				if !h.holding {
					h.holding = true
					p.held = append(p.held, h)
				}
				h.chunks = append(h.chunks, append([]byte(nil), buf[:n]...))
				p.mu.Unlock()
				if err != nil && p.holding(h, true) {
					return // ReleaseHeld closes the connection
				}
				continue
			}
			p.mu.Unlock()
			if _, werr := server.Write(buf[:n]); werr != nil {
				closeBoth()
				return
			}
		}
		if err != nil {
			if p.holding(h, true) {
				return // ReleaseHeld delivers what was held, then closes
			}
			closeBoth()
			return
		}
	}
}
