package testenv

import (
	"io"
	"net"
	"testing"
	"time"
)

// TestProxyBlackHole checks that a black hole forwards nothing either way
// and closes no connection, and that lifting it delivers what was held.
func TestProxyBlackHole(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() { // an echo server
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); c.Close() }()
		}
	}()
	p := StartProxy(t, ln.Addr().String())
	c, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	echo := func(msg string, within time.Duration) (string, error) {
		if _, err := c.Write([]byte(msg)); err != nil {
			return "", err
		}
		_ = c.SetReadDeadline(time.Now().Add(within))
		buf := make([]byte, len(msg))
		_, err := io.ReadFull(c, buf)
		return string(buf), err
	}
	if got, err := echo("before", 5*time.Second); err != nil || got != "before" {
		t.Fatalf("through the proxy: %q %v", got, err)
	}
	p.BlackHole(true)
	if got, err := echo("during", 300*time.Millisecond); err == nil {
		t.Fatalf("the black hole forwarded %q", got)
	} else if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Fatalf("in the black hole the connection failed instead of going silent: %v", err)
	}
	p.BlackHole(false)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, len("during"))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "during" {
		t.Fatalf("after the black hole: %q %v, want the held bytes", buf, err)
	}
}

// TestProxyHold checks that a held connection forwards nothing from the
// chunk that matched on, that ReleaseHeld delivers it in order, and that
// a client that closed meanwhile still has its chunks delivered.
func TestProxyHold(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	got := make(chan string, 16)
	go func() { // an echo server that also reports what it read
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				buf := make([]byte, 64)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						got <- string(buf[:n])
						_, _ = c.Write(buf[:n])
					}
					if err != nil {
						c.Close()
						return
					}
				}
			}()
		}
	}()
	p := StartProxy(t, ln.Addr().String())
	p.Hold(func(chunk []byte) bool { return string(chunk) == "hold" })
	a, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	b, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	send := func(c net.Conn, msg string) {
		if _, err := c.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond) // one chunk each
	}
	send(a, "pass")
	if s := <-got; s != "pass" {
		t.Fatalf("server read %q", s)
	}
	send(a, "hold")
	send(a, "after")
	send(b, "hold")
	a.Close()
	for p.Held() < 2 {
		time.Sleep(time.Millisecond)
	}
	select {
	case s := <-got:
		t.Fatalf("server read %q while held", s)
	case <-time.After(100 * time.Millisecond):
	}
	if err := p.ReleaseHeld(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	var all string
	for len(all) < len("holdafterhold") {
		all += <-got
	}
	if all != "holdafterhold" {
		t.Fatalf("server read %q after release, want the held chunks in order", all)
	}
}

// TestProxyLoseReplyAfter checks that after the matching chunk the server
// gets the request and keeps its connection open for the wait, while
// nothing it sends (an early answer, then the reply) reaches the client,
// which then sees its connection cut.
func TestProxyLoseReplyAfter(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	wrote := make(chan error, 1)
	go func() { // answers at once, replies 50ms later, then waits for EOF
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 64)
		if _, err := c.Read(buf); err != nil {
			wrote <- err
			return
		}
		if _, err := c.Write([]byte("ack")); err != nil {
			wrote <- err
			return
		}
		time.Sleep(50 * time.Millisecond)
		_, err = c.Write([]byte("reply"))
		wrote <- err
		_, _ = io.Copy(io.Discard, c)
	}()
	p := StartProxy(t, ln.Addr().String())
	p.LoseReplyAfter(func(chunk []byte) bool { return string(chunk) == "request" }, 300*time.Millisecond)
	c, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	began := time.Now()
	if _, err := c.Write([]byte("request")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := c.Read(make([]byte, 64))
	if n != 0 || err == nil {
		t.Fatalf("the client read %d bytes (%v) after its reply was to be lost", n, err)
	}
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("the connection was not cut after the wait")
	}
	if d := time.Since(began); d < 300*time.Millisecond {
		t.Fatalf("the connection was cut after %v, before the 300ms wait", d)
	}
	if err := <-wrote; err != nil {
		t.Fatalf("the server could not send its reply within the wait: %v", err)
	}
	if p.Cuts() != 1 {
		t.Fatalf("cuts %d, want 1", p.Cuts())
	}
}
