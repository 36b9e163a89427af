package fenceddynamodb_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/drivertest"
	"github.com/fenced-dev/fenced/fence"
	"github.com/fenced-dev/fenced/internal/testkit/crashtest"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

func uniqueKey(name string) string {
	return fmt.Sprintf("%s:%d", name, time.Now().UnixNano())
}

// A holder process frozen with SIGSTOP past its TTL is replaced only after
// the waiter has watched its last version for a whole TTL (so at least a
// TTL after the freeze, whatever was left of the holder's lease), with a
// higher fence; the new holder claims the resource, and the frozen
// holder's write, sent when it runs again, is refused there.
func TestFrozenHolderIsReplacedAfterAWatchedTTL(t *testing.T) {
	if testing.Short() {
		t.Skip("long: SIGSTOP of a holder past its TTL; run without -short")
	}
	t.Parallel()
	ctx := ctxT(t)
	const ttl = 1500 * time.Millisecond
	key := uniqueKey("frozen")
	store := fence.NewMemoryStore()
	// Once the new holder's claim has raised the resource's fence, no
	// write may be applied: the frozen holder's must all be refused.
	var claimed atomic.Bool
	var lateApplied atomic.Int32
	resource := httptest.NewServer(fence.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if claimed.Load() {
			lateApplied.Add(1)
		}
		w.WriteHeader(http.StatusNoContent)
	}), &fence.MiddlewareOptions{Store: store, Key: fence.FixedKey(key)}))
	defer resource.Close()

	url := server.URL(table, "")
	holder := testenv.Start(t, "holder", crashtest.GuardedHolderCommand(url, key, ttl, resource.URL))
	holder.WaitLog(t, "WRITE 3 applied", time.Minute)
	var holderFence uint64
	for _, line := range testenv.Lines(holder.Log.String()) {
		if f, ok := strings.CutPrefix(line, "FENCE "); ok {
			holderFence, _ = strconv.ParseUint(f, 10, 64)
		}
	}
	c, err := fenced.Open(ctx, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	if err := holder.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	frozen := time.Now()
	l, err := c.Acquire(ctx, key, &fenced.LeaseOptions{TTL: ttl, MaxWait: 30 * time.Second})
	if err != nil {
		t.Fatalf("waiter while the holder is frozen: %v", err)
	}
	defer l.Release(context.Background())
	waited := time.Since(frozen)
	if waited < ttl {
		t.Fatalf("the frozen holder was replaced %v after the freeze, before the waiter could have watched its last version for a whole TTL (%v)", waited, ttl)
	}
	if l.Fence() <= holderFence {
		t.Fatalf("replacement fence %d, want > the frozen holder's %d", l.Fence(), holderFence)
	}
	t.Logf("holder (fence %d) frozen; replaced %v later (TTL %v) with fence %d", holderFence, waited.Round(time.Millisecond), ttl, l.Fence())

	// Claim first: the new holder's write raises the resource's fence.
	req, _ := http.NewRequestWithContext(fence.WithLease(ctx, l), http.MethodPost, resource.URL, nil)
	resp, err := (&http.Client{Transport: &fence.Transport{}}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if err := fence.ResponseError(resp); err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("the new holder's claim: %d %v", resp.StatusCode, err)
	}
	resp.Body.Close()
	claimed.Store(true)
	before := holder.Log.String()
	if err := holder.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	holder.WaitLog(t, "ENDED", 30*time.Second)
	after := strings.TrimPrefix(holder.Log.String(), before)
	t.Logf("frozen holder after SIGCONT:\n%s", after)
	// (An "applied" line may still show up in after: a write the resource
	// applied before the claim, whose answer the holder was frozen before
	// logging.)
	if n := lateApplied.Load(); n > 0 || !strings.Contains(after, "REFUSED") {
		t.Fatalf("the frozen holder's late writes were not refused (%d applied after the new holder's claim):\n%s", n, after)
	}
	if !strings.Contains(after, "ENDED lost") && !strings.Contains(after, "ENDED expired") {
		t.Fatalf("the frozen holder's lease did not end with ErrLost or ErrExpired:\n%s", after)
	}
	if f, _ := store.Current(key); f != l.Fence() {
		t.Fatalf("resource fence %d after the late write, want the new holder's %d", f, l.Fence())
	}
	if info, err := c.Inspect(ctx, key); err != nil || !info.Held || info.Fence != l.Fence() {
		t.Fatalf("after the frozen holder ran again: %+v, %v; want the new holder with fence %d", info, err, l.Fence())
	}
}

// A holder that keeps renewing is never taken over, however many waiters
// (each its own process's driver) watch it for several TTLs: every renewal
// raises the version, so no waiter ever sees one version for a whole TTL.
func TestRenewingHolderIsNeverTakenOver(t *testing.T) {
	if testing.Short() {
		t.Skip("long: waiters watch a holder for several TTLs; run without -short")
	}
	t.Parallel()
	ctx := ctxT(t)
	const waiters = 8
	key := uniqueKey("renewing")
	url := server.URL(table, "")
	h, err := fenced.Open(ctx, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	cs := make([]*fenced.Client, waiters)
	for i := range cs {
		c, err := fenced.Open(ctx, url, &fenced.Options{MinBackoff: 5 * time.Millisecond, MaxBackoff: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		cs[i] = c
	}
	// The holder renews while the waiters poll the one store: a TTL the
	// nine renew in time on this machine, at least a second.
	ttl := drivertest.MeasuredTTL(t, time.Second, append(cs, h)...)
	l, err := h.TryAcquire(ctx, key, &fenced.LeaseOptions{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, waiters)
	for _, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stolen, err := c.Acquire(ctx, key, &fenced.LeaseOptions{TTL: ttl, MaxWait: 3 * ttl})
			if err == nil {
				errs <- fmt.Errorf("TWO HOLDERS: a waiter took over fence %d with fence %d while the holder renewed (holder: %v)", l.Fence(), stolen.Fence(), l.Err())
				stolen.Release(ctx)
				return
			}
			if !errors.Is(err, fenced.ErrHeld) {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if err := l.Err(); err != nil {
		t.Fatalf("the renewing holder's lease ended: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A waiter that arrives after a holder died still watches the grant for a
// whole TTL before taking it over: with no server clock, nothing tells it
// how long ago the last renewal was. This measures what that costs.
func TestLateWaiterWatchesAWholeTTL(t *testing.T) {
	if testing.Short() {
		t.Skip("long: a late waiter watches a whole TTL; run without -short")
	}
	t.Parallel()
	ctx := ctxT(t)
	const ttl = time.Second
	key := uniqueKey("late")
	dead := open(t)
	f, err := dead.TryAcquire(ctx, key, "dead0000000000000000000000000000", ttl)
	if err != nil {
		t.Fatal(err)
	}
	granted := time.Now()
	dead.Close() // the holder is gone: nobody renews
	time.Sleep(2 * ttl)
	c, err := fenced.Open(ctx, server.URL(table, ""), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	arrived := time.Now()
	l, err := c.Acquire(ctx, key, &fenced.LeaseOptions{TTL: ttl, MaxWait: 10 * ttl})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	waited := time.Since(arrived)
	if waited < ttl {
		t.Fatalf("a late waiter took over after %v, less than a TTL (%v) of watching", waited, ttl)
	}
	if l.Fence() <= f {
		t.Fatalf("fence %d after takeover, want > %d", l.Fence(), f)
	}
	t.Logf("grant (TTL %v) ran out %v before the waiter arrived; the waiter still waited %v (one watched TTL plus polling)",
		ttl, arrived.Sub(granted.Add(ttl)).Round(time.Millisecond), waited.Round(time.Millisecond))
}
