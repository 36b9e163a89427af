package testenv

import (
	"io"
	"net"
	"sync"
	"testing"
)

// Proxy forwards TCP connections from a local port to a server, and can
// cut a connection at a chosen moment, to inject connection loss, or turn
// into a black hole (BlackHole): a partition whose connections stay open.
type Proxy struct {
	Addr string // where clients connect

	mu sync.Mutex
	// cutAfter, when set, sees every chunk a client sends; when it returns
	// true the chunk is forwarded to the server and the connection is cut
	// before the server's reply reaches the client.
	cutAfter func(chunk []byte) bool
	cuts     int
	down     bool
	observe  func(chunk []byte)
	ln       net.Listener
	target   string
	open     map[net.Conn]struct{} // both ends of every open connection
	// hole is non-nil while the proxy is a black hole; it is closed when
	// the black hole ends.
	hole chan struct{}
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

// SetDown makes the proxy close every new connection at once while down is
// true, as a server that went away would; connections already open are not
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

// Retarget sends new connections to target from now on and closes every
// connection open through the proxy, as clients that follow a failover to
// a new primary do.
func (p *Proxy) Retarget(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = target
	for c := range p.open {
		c.Close()
	}
}

// BlackHole makes the proxy, while on is true, stop reading from and
// writing to every connection, open or new, without closing any: bytes
// already sent are neither delivered nor refused, the peers' socket
// buffers and flow-control windows fill, and writes then block, as
// over a network that drops every packet. New connections are accepted
// (the kernel does so anyway) and left silent. Turning it off forwards
// what was held and resumes.
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
			if n > 0 {
				if _, werr := client.Write(buf[:n]); werr != nil {
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
				close(cut)
			}
			p.mu.Unlock()
			if _, werr := server.Write(buf[:n]); werr != nil {
				closeBoth()
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				closeBoth()
			}
			closeBoth()
			return
		}
	}
}
