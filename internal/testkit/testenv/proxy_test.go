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
