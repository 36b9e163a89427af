package drivertest_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/drivertest"
	"github.com/fenced-dev/fenced/mem"
)

// brokenEnv selects, in a child run of this test binary, which broken
// driver TestBrokenDriverHelper gives the suite.
const brokenEnv = "FENCED_DRIVERTEST_BROKEN"

// lifo declares FIFO but grants a contended key to the waiter that
// arrived last: of the owners still trying for a key, only the newest is
// let through to the store.
type lifo struct {
	*mem.Driver
	mu     *sync.Mutex
	trying map[string][]string // key → owners not yet granted, oldest first
}

func (d lifo) TryAcquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	d.mu.Lock()
	q := d.trying[key]
	found := false
	for _, o := range q {
		found = found || o == owner
	}
	if !found {
		q = append(q, owner)
		d.trying[key] = q
	}
	newest := q[len(q)-1] == owner
	d.mu.Unlock()
	if !newest {
		return 0, &fenced.HeldError{}
	}
	f, err := d.Driver.TryAcquire(ctx, key, owner, ttl)
	if err == nil {
		d.mu.Lock()
		d.trying[key] = d.trying[key][:len(d.trying[key])-1]
		d.mu.Unlock()
	}
	return f, err
}

// Capabilities declares a FIFO queue, which AcquireTimed is not.
func (d lifo) Capabilities() driver.Capabilities {
	c := d.Driver.Capabilities()
	c.Queue, c.FIFO = true, true
	return c
}

// AcquireTimed "queues" by polling TryAcquire, so the newest owner wins.
func (d lifo) AcquireTimed(ctx context.Context, key, owner string, ttl time.Duration) (uint64, time.Time, error) {
	for {
		sent := time.Now()
		f, err := d.TryAcquire(ctx, key, owner, ttl)
		if err == nil || !errors.Is(err, fenced.ErrHeld) {
			return f, sent, err
		}
		select {
		case <-ctx.Done():
			return 0, time.Time{}, context.Cause(ctx)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// claims declares what mem declares but hides mem's optional methods.
type claims struct{ driver.Driver }

// hidden has mem's optional methods but declares none of them.
type hidden struct{ *mem.Driver }

func (hidden) Capabilities() driver.Capabilities { return driver.Capabilities{} }

// deaf declares Notify but its subscriptions never fire.
type deaf struct{ *mem.Driver }

func (deaf) Subscribe(ctx context.Context, key string) (driver.Subscription, error) {
	return silent{make(chan struct{})}, nil
}

type silent struct{ c chan struct{} }

func (s silent) C() <-chan struct{} { return s.c }
func (s silent) Close() error       { return nil }

// blind implements driver.LossWatcher but never reports a loss.
type blind struct{ *mem.Driver }

func (blind) WatchLoss(g driver.Grant, lost func(error)) (func(), error) {
	return func() {}, nil
}

// TestBrokenDriverHelper is not a test of its own: TestBrokenDriversFail
// runs it in a child process with brokenEnv set, and expects it to fail.
func TestBrokenDriverHelper(t *testing.T) {
	kind := os.Getenv(brokenEnv)
	if kind == "" {
		t.Skip("run by TestBrokenDriversFail in a child process")
	}
	store := mem.NewStore(nil)
	var mu sync.Mutex
	trying := map[string][]string{}
	drivertest.RunConformanceTests(t, drivertest.Harness{
		Open: func(*testing.T) driver.Driver {
			d := store.Driver()
			switch kind {
			case "fifo":
				return lifo{Driver: d, mu: &mu, trying: trying}
			case "notify":
				return deaf{d}
			case "loss":
				return blind{d}
			case "claims":
				return claims{d}
			case "hidden":
				return hidden{d}
			}
			return d
		},
	})
}

// The suite fails a driver that declares a capability and does not
// deliver it, and skips, naming it, a capability that is not declared.
func TestBrokenDriversFail(t *testing.T) {
	for _, c := range []struct {
		kind, subtest string
		fail          bool
		says          string
	}{
		{"fifo", "FIFOWaitersServedInArrivalOrder", true, "backend declares FIFO, but waiters"},
		{"notify", "NotifiedWaiterIsWokenWithoutPolling", true, "waiter not woken by the release"},
		{"loss", "LossWatchReportsBreak", true, "was not reported within 20s"},
		{"claims", "CapabilitiesMatchMethods", true, "declares Subscribe (driver.Notifier) but lacks its methods"},
		{"hidden", "CapabilitiesMatchMethods", true, "has the methods of WatchLoss (driver.LossWatcher) but does not declare it"},
		{"hidden", "CapabilitiesMatchMethods", true, "has the methods of Subscribe (driver.Notifier) but does not declare it, and they answer <nil>"},
		// mem as it is, without Options.Queue: no FIFO queue.
		{"honest", "FIFOWaitersServedInArrivalOrder", false, "capability FIFO (Capabilities.FIFO) not declared"},
		{"honest", "CapabilitiesMatchMethods", false, "PASS"},
	} {
		t.Run(c.kind+"/"+c.subtest, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestBrokenDriverHelper$/^"+c.subtest+"$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), brokenEnv+"="+c.kind)
			out, err := cmd.CombinedOutput()
			failed := err != nil
			if _, ok := err.(*exec.ExitError); err != nil && !ok {
				t.Fatalf("running the child: %v", err)
			}
			if failed != c.fail || !strings.Contains(string(out), c.says) {
				t.Fatalf("child with the %s driver: failed=%v, want %v, saying %q; output:\n%s", c.kind, failed, c.fail, c.says, out)
			}
			if !c.fail && c.says != "PASS" && !strings.Contains(string(out), "--- SKIP: TestBrokenDriverHelper/"+c.subtest) {
				t.Fatalf("an undeclared capability was not skipped; output:\n%s", out)
			}
		})
	}
}
