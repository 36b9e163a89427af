package proof

import (
	"fmt"
	"io"
	"net"
	"net/url"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proxy forwards one worker's connections to one authority address, so the
// nemesis can cut that worker off (M4) or stop it the moment its request
// has left (M9) without touching the other workers.
type proxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	cond   *sync.Cond
	down   bool       // while true nothing is forwarded either way
	onSend func()     // called once after the next client chunk is forwarded
	conns  []net.Conn // every open connection, both ends
	closed bool
}

func startProxy(target string) (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("proof: proxy: %w", err)
	}
	p := &proxy{ln: ln, target: target}
	p.cond = sync.NewCond(&p.mu)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	return p, nil
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

// setDown stops (true) or resumes forwarding. Bytes sent meanwhile wait in
// the proxy, as TCP would keep retransmitting them through a partition.
func (p *proxy) setDown(down bool) {
	p.mu.Lock()
	p.down = down
	p.mu.Unlock()
	p.cond.Broadcast()
}

// afterNextSend arms f to run once, right after the next chunk the client
// sends has been forwarded.
func (p *proxy) afterNextSend(f func()) {
	p.mu.Lock()
	p.onSend = f
	p.mu.Unlock()
}

func (p *proxy) close() {
	p.ln.Close()
	p.mu.Lock()
	p.closed, p.down = true, false
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.cond.Broadcast()
}

// gate waits while the proxy is down.
func (p *proxy) gate() {
	p.mu.Lock()
	for p.down && !p.closed {
		p.cond.Wait()
	}
	p.mu.Unlock()
}

func (p *proxy) serve(client net.Conn) {
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		client.Close()
		return
	}
	p.mu.Lock()
	p.conns = append(p.conns, client, server)
	p.mu.Unlock()
	pipe := func(dst, src net.Conn, fromClient bool) {
		defer dst.Close()
		defer src.Close()
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				p.gate()
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
				if fromClient {
					p.mu.Lock()
					f := p.onSend
					p.onSend = nil
					p.mu.Unlock()
					if f != nil {
						f()
					}
				}
			}
			if err != nil {
				if err != io.EOF {
					return
				}
				return
			}
		}
	}
	go pipe(client, server, false)
	pipe(server, client, true)
}

// proxyURL returns store with every host:port of its host list (hosts
// separated by commas, as the redis, redlock, etcd, zk and postgres URLs
// write them) replaced by what via returns for it. Hosts in query
// parameters (a redlock fence source) are left alone.
func proxyURL(store string, via func(hostport string) (string, error)) (string, error) {
	u, err := url.Parse(store)
	if err != nil {
		return "", err
	}
	if u.Host == "" {
		return "", fmt.Errorf("proof: store URL %s names no host to put a proxy in front of", store)
	}
	hosts := strings.Split(u.Host, ",")
	for i, h := range hosts {
		if !strings.Contains(h, ":") {
			return "", fmt.Errorf("proof: store URL host %q has no port", h)
		}
		if hosts[i], err = via(h); err != nil {
			return "", err
		}
	}
	u.Host = strings.Join(hosts, ",")
	return u.String(), nil
}

// stopAfterProxySend stops worker w (cmd) with SIGSTOP right after one of
// its proxies forwarded the next chunk it sends (M9), and records the stop.
// A worker of a multi-host store (Redlock: one proxy per node) sends to
// several proxies at once: the first one stops it.
func (r *run) stopAfterProxySend(w int, cmd *exec.Cmd, long time.Duration) error {
	stopped := make(chan struct{})
	var stop sync.Once
	for _, p := range r.proxies[w] {
		p.afterNextSend(func() {
			stop.Do(func() {
				cmd.Process.Signal(syscall.SIGSTOP)
				r.record(Event{Kind: FaultStart, Worker: w, Fault: string(PauseMidAcquire)})
				close(stopped)
			})
		})
	}
	defer func() {
		for _, p := range r.proxies[w] {
			p.afterNextSend(nil)
		}
	}()
	select {
	case <-stopped:
		return nil
	case <-time.After(long):
		return fmt.Errorf("worker %d sent nothing after its release", w)
	}
}
