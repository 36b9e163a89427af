package fencedredlock_test

import (
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
)

// TestUnconfirmedReleaseIsFinished: a release that two of three nodes do
// not answer within the budget (stopped, as a loaded host's would be)
// must still free the key there once they answer again, not leave it
// held for the TTL.
func TestUnconfirmedReleaseIsFinished(t *testing.T) {
	ctx := ctxT(t)
	c := startCluster(t, 3)
	opts := c.fenced(t)
	opts.Budget = 200 * time.Millisecond
	d := c.open(t, c.nodes, opts)
	other := c.open(t, c.nodes, opts)
	const ttl = 20 * time.Second
	var f uint64
	o := owner()
	for i := 0; ; i++ { // retried: the first dials may exceed the budget
		var err error
		if f, err = d.TryAcquire(ctx, "k", o, ttl); err == nil {
			break
		}
		if i == 20 {
			t.Fatal(err)
		}
	}
	g := driver.Grant{Key: "k", Owner: o, Fence: f, TTL: ttl}
	c.nodes[0].Signal(syscall.SIGSTOP)
	c.nodes[1].Signal(syscall.SIGSTOP)
	err := d.Release(ctx, g)
	c.nodes[0].Signal(syscall.SIGCONT)
	c.nodes[1].Signal(syscall.SIGCONT)
	if !errors.Is(err, fenced.ErrUnknownOutcome) {
		t.Fatalf("release with 2 of 3 stopped: %v, want ErrUnknownOutcome", err)
	}
	start := time.Now()
	for {
		_, err := other.TryAcquire(ctx, "k", owner(), ttl)
		if err == nil {
			t.Logf("free again %v after the nodes resumed", time.Since(start).Round(time.Millisecond))
			return
		}
		if time.Since(start) > 5*time.Second {
			t.Fatalf("still not free %v after the nodes resumed (TTL %v): %v", time.Since(start).Round(time.Millisecond), ttl, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
