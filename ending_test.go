package fenced_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/clock"
	"github.com/fenced-dev/fenced/mem"
)

// TestErrWhileTheLeaseIsBeingEnded: a lease whose end has begun elsewhere
// (its expiry on the schedule marked it ended and waits for the
// schedule's lock before it cancels the context) is not held: Err must
// not say nil then. Before the fix it did, so after a SIGSTOP past the
// lease a resumed leader whose expiry timer fired at the same instant as
// its own look read fencedk8s's LeaderContext live, 2.7 s after the next
// leader's began (the generative elector proof, Redis, seed
// 1796483709750853554, four CPU hogs alongside).
func TestErrWhileTheLeaseIsBeingEnded(t *testing.T) {
	c := fenced.NewClient(mem.NewStore(clock.Real()).Driver(), nil)
	t.Cleanup(func() { c.Close() })
	l, err := c.TryAcquire(context.Background(), "ending", &fenced.LeaseOptions{TTL: 10 * time.Second, ManualRenew: true})
	if err != nil {
		t.Fatal(err)
	}
	finish := fenced.EndHalfway(l, fenced.ErrLost)
	const lag = 50 * time.Millisecond
	go func() { time.Sleep(lag); finish() }()
	start := time.Now()
	if err := l.Err(); !errors.Is(err, fenced.ErrLost) {
		t.Fatalf("Err while the lease was being ended: %v, want its cause (ErrLost) once the end is done", err)
	}
	if waited := time.Since(start); waited < lag/2 {
		t.Fatalf("Err returned after %v, before the end it reports was done", waited)
	}
}
