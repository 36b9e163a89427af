package drivertest

import (
	"testing"
	"time"

	"github.com/fenced-dev/fenced/driver"
)

// observeBound is how long a release or break may take to wake an
// observer: a liveness bound, far above a notification's round trip.
const observeBound = 20 * time.Second

// testObserve checks that an observer (driver.ObserveNotifier) is woken by
// a release and by a break made through another driver once
// SubscribeObserver returned, and that Close ends the subscription. A
// grant may wake it too; the test drains such wake-ups before each step.
func (s *suite) testObserve(t *testing.T) {
	d := s.drv(t)
	if !d.Capabilities().Observe {
		skipUndeclared(t, "Observe (driver.ObserveNotifier)", "observers read the store on a timer")
	}
	ctx := Context(t)
	key := Key("observe")
	sub, err := d.(driver.ObserveNotifier).SubscribeObserver(ctx, key)
	if err != nil {
		t.Fatalf("SubscribeObserver: %v", err)
	}
	other := s.drv(t)
	grant := func() driver.Grant {
		g := driver.Grant{Key: key, Owner: owner(), TTL: time.Minute}
		if g.Fence, err = other.TryAcquire(ctx, key, g.Owner, g.TTL); err != nil {
			t.Fatalf("TryAcquire: %v", err)
		}
		for len(sub.C()) > 0 { // a grant may wake it too
			<-sub.C()
		}
		return g
	}
	woken := func(what string) {
		t.Helper()
		select {
		case <-sub.C():
		case <-time.After(observeBound):
			t.Fatalf("backend declares Observe, but a %s by another client did not wake the observer within %v", what, observeBound)
		}
	}
	g := grant()
	if err := other.Release(ctx, g); err != nil {
		t.Fatalf("Release: %v", err)
	}
	woken("release")
	grant()
	if _, err := d.Break(ctx, key, "drivertest observe", "drivertest"); err != nil {
		t.Fatalf("Break: %v", err)
	}
	woken("break")
	if err := sub.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}
