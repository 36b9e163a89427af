package fenced_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/clock"
	"github.com/fenced-dev/fenced/mem"
)

// recorder keeps every hook event, for tests of what adapters receive.
type recorder struct {
	mu       sync.Mutex
	attempts []fenced.Event
	acquired []fenced.Event
	renewed  []fenced.Event
	lost     []fenced.Event
	released []fenced.Event
	// endCauses are the lease's end causes, read in the release hook.
	endCauses []error
}

func (r *recorder) hook(e fenced.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch e.Kind {
	case fenced.EventAttempt:
		r.attempts = append(r.attempts, e)
	case fenced.EventAcquire:
		r.acquired = append(r.acquired, e)
	case fenced.EventRenew:
		r.renewed = append(r.renewed, e)
	case fenced.EventLost:
		r.lost = append(r.lost, e)
	case fenced.EventRelease:
		r.released = append(r.released, e)
		r.endCauses = append(r.endCauses, e.Lease.Err())
	}
}

type ctxKey struct{}

// Every event about a granted lease carries the lease; acquire events carry
// the caller's context and the resolved wait; release events say whether
// the holder or Close released.
func TestHookEventsCarryLeaseContextAndCause(t *testing.T) {
	clk := clock.NewFake(time.Unix(1000, 0))
	var r recorder
	c := fenced.NewClient(mem.New(&mem.Options{Clock: clk}), &fenced.Options{Clock: clk, Hook: r.hook})
	ctx := context.WithValue(context.Background(), ctxKey{}, "caller")

	l, err := c.TryAcquire(ctx, "job:a", &fenced.LeaseOptions{TTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.TryAcquire(ctx, "job:a", nil); !errors.Is(err, fenced.ErrHeld) {
		t.Fatalf("second TryAcquire: %v, want ErrHeld", err)
	}
	advance(clk, 1100*time.Millisecond, 100*time.Millisecond) // one renewal
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	closed, err := c.Acquire(ctx, "job:b", &fenced.LeaseOptions{MaxWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	c.Close()

	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.attempts) == 0 || r.attempts[0].Context == nil || r.attempts[0].Context.Value(ctxKey{}) != "caller" {
		t.Fatalf("EventAttempt does not carry the caller's context: %+v", r.attempts)
	}
	if len(r.acquired) != 3 {
		t.Fatalf("%d acquire events, want 3", len(r.acquired))
	}
	ok, held, waited := r.acquired[0], r.acquired[1], r.acquired[2]
	if ok.Lease != l || ok.Context.Value(ctxKey{}) != "caller" || ok.MaxWait != 0 {
		t.Fatalf("granted EventAcquire: Lease %p (want %p), MaxWait %v, context %v", ok.Lease, l, ok.MaxWait, ok.Context)
	}
	if held.Lease != nil || held.Err == nil || held.MaxWait != 0 {
		t.Fatalf("refused EventAcquire: %+v", held)
	}
	if waited.Lease != closed || waited.MaxWait != time.Second {
		t.Fatalf("waiting EventAcquire: Lease %p (want %p), MaxWait %v", waited.Lease, closed, waited.MaxWait)
	}
	if len(r.renewed) == 0 || r.renewed[0].Lease != l {
		t.Fatalf("EventRenew without the lease: %+v", r.renewed)
	}
	if len(r.released) != 2 {
		t.Fatalf("%d release events, want 2", len(r.released))
	}
	if e, cause := r.released[0], r.endCauses[0]; e.Lease != l || e.Key != "job:a" || !errors.Is(cause, fenced.ErrReleased) {
		t.Fatalf("Release: Lease %p (want %p), key %q, end cause %v (want ErrReleased)", e.Lease, l, e.Key, cause)
	}
	if e, cause := r.released[1], r.endCauses[1]; e.Lease != closed || !errors.Is(cause, fenced.ErrClosed) {
		t.Fatalf("Close: Lease %p (want %p), end cause %v (want ErrClosed)", e.Lease, closed, cause)
	}
}

// A break recorded in the store's audit log turns the refused renewal into
// a loss that says who broke the lease and why (ErrBroken, still ErrLost).
func TestBrokenLeaseCauseNamesTheBreak(t *testing.T) {
	clk := clock.NewFake(time.Unix(1000, 0))
	var r recorder
	c := fenced.NewClient(mem.New(&mem.Options{Clock: clk}), &fenced.Options{Clock: clk, Hook: r.hook})
	defer c.Close()
	ctx := context.Background()
	l, err := c.TryAcquire(ctx, "job:broken", &fenced.LeaseOptions{TTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Break(ctx, "job:broken", "host wedged, OPS-12", "alice"); err != nil {
		t.Fatal(err)
	}
	advance(clk, 1100*time.Millisecond, 100*time.Millisecond)
	cause := l.Err()
	if !errors.Is(cause, fenced.ErrBroken) || !errors.Is(cause, fenced.ErrLost) || !fenced.IsLost(cause) {
		t.Fatalf("cause %v: want ErrBroken and ErrLost", cause)
	}
	if msg := cause.Error(); !strings.Contains(msg, "alice") || !strings.Contains(msg, "host wedged, OPS-12") {
		t.Fatalf("cause %q does not say who broke the lease and why", msg)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.lost) != 1 || r.lost[0].Lease != l || !errors.Is(r.lost[0].Err, fenced.ErrBroken) {
		t.Fatalf("Lost events %+v: want one for the lease, with ErrBroken", r.lost)
	}

	// A grant replaced without a break (expired and taken by another owner)
	// is lost, not broken.
	c2 := fenced.NewClient(mem.New(&mem.Options{Clock: clk}), &fenced.Options{Clock: clk})
	defer c2.Close()
	l2, err := c2.TryAcquire(ctx, "job:expired", &fenced.LeaseOptions{TTL: 3 * time.Second, ManualRenew: true})
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(3100 * time.Millisecond)
	settle()
	if _, err := c2.TryAcquire(ctx, "job:expired", nil); err != nil {
		t.Fatal(err)
	}
	if err := l2.Renew(ctx); err == nil {
		t.Fatal("renewal of a replaced grant succeeded")
	}
	if errors.Is(l2.Err(), fenced.ErrBroken) {
		t.Fatalf("an expired grant is reported as broken: %v", l2.Err())
	}
}
