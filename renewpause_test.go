package fenced_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/core/rootaccess"
	"github.com/fenced-dev/fenced/mem"
)

// heldRenewals is a mem driver whose renewals wait for a word on release
// when hold is set, and which counts the renewals begun.
type heldRenewals struct {
	*mem.Driver
	hold    atomic.Bool
	begun   atomic.Int64
	waiting chan struct{} // a renewal waits on release
	release chan struct{}
}

func (d *heldRenewals) Renew(ctx context.Context, g driver.Grant) error {
	d.begun.Add(1)
	if d.hold.Load() {
		d.waiting <- struct{}{}
		<-d.release
	}
	return d.Driver.Renew(ctx, g)
}

// TestPauseRenewalsWaitsForTheOneInFlight checks the pause a process
// takes before it stops itself: it returns only once the renewal in
// flight has ended, no renewal begins until resume, and renewals go on
// after it. (A process stopped mid-renewal on SQLite keeps the file's
// write lock from everyone until it is continued.)
func TestPauseRenewalsWaitsForTheOneInFlight(t *testing.T) {
	d := &heldRenewals{Driver: mem.New(nil), waiting: make(chan struct{}), release: make(chan struct{})}
	c := fenced.NewClient(d, nil)
	defer c.Close()
	const ttl = 3 * time.Second // renewed every second
	l, err := c.TryAcquire(context.Background(), "pause", &fenced.LeaseOptions{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	d.hold.Store(true)
	<-d.waiting // a renewal is in flight, held
	paused := make(chan func())
	go func() { paused <- rootaccess.PauseRenewals(c) }()
	// The pause must not return while the renewal is held; it cannot
	// return early and pass, whatever the machine's speed.
	select {
	case <-paused:
		t.Fatal("PauseRenewals returned with a renewal in flight")
	case <-time.After(300 * time.Millisecond):
	}
	d.hold.Store(false)
	d.release <- struct{}{}
	resume := <-paused
	begun := d.begun.Load()
	// Paused for longer than a renewal period: none may begin.
	time.Sleep(ttl / 2)
	if err := l.Err(); err != nil {
		t.Logf("the lease ended while paused (a busy machine): %v", err)
	}
	if n := d.begun.Load(); n != begun {
		t.Fatalf("%d renewals began while paused", n-begun)
	}
	resume()
	resume() // a second call does nothing
	deadline := time.Now().Add(10 * ttl)
	for d.begun.Load() == begun {
		if time.Now().After(deadline) {
			t.Fatalf("no renewal within %v of resume", 10*ttl)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestCloseWhilePausedReturns checks that Close does not wait for a
// paused client's resume.
func TestCloseWhilePausedReturns(t *testing.T) {
	d := &heldRenewals{Driver: mem.New(nil)}
	c := fenced.NewClient(d, nil)
	if _, err := c.TryAcquire(context.Background(), "pause", &fenced.LeaseOptions{TTL: 300 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	resume := rootaccess.PauseRenewals(c)
	defer resume()
	time.Sleep(200 * time.Millisecond) // a renewal is due and waits at the gate
	done := make(chan error, 1)
	go func() { done <- c.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Close waited for the paused renewals' resume")
	}
}
