package fenced_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/clock"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/mem"
)

// gate wraps a driver of a real mem store and lets a test act at the
// moment a request reaches the authority: before a release frees a key,
// after a grant is made, or by holding a request there (a hung authority).
// mem decides every grant and release.
type gate struct {
	*mem.Driver

	mu            sync.Mutex
	beforeRelease func(g driver.Grant) // called before the key is freed
	holdGrantOf   string               // TryAcquire of this key waits for proceed after mem granted it
	granted       chan struct{}        // closed when that grant is made
	proceed       chan struct{}
	hang          chan struct{} // while open, hung calls wait for it, ignoring their context
	hangRelease   bool
	hangRenew     bool
}

func newGate(s *mem.Store) *gate {
	return &gate{Driver: s.Driver(), granted: make(chan struct{}), proceed: make(chan struct{}), hang: make(chan struct{})}
}

func (g *gate) TryAcquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	fence, err := g.Driver.TryAcquire(ctx, key, owner, ttl)
	g.mu.Lock()
	hold := key == g.holdGrantOf && err == nil
	g.mu.Unlock()
	if hold {
		close(g.granted)
		<-g.proceed
	}
	return fence, err
}

func (g *gate) Renew(ctx context.Context, gr driver.Grant) error {
	g.mu.Lock()
	hang := g.hangRenew
	g.mu.Unlock()
	if hang {
		<-g.hang
	}
	return g.Driver.Renew(ctx, gr)
}

func (g *gate) Release(ctx context.Context, gr driver.Grant) error {
	g.mu.Lock()
	before, hang := g.beforeRelease, g.hangRelease
	g.mu.Unlock()
	if before != nil {
		before(gr)
	}
	if hang {
		<-g.hang
	}
	return g.Driver.Release(ctx, gr)
}

func (g *gate) set(fn func(g *gate)) {
	g.mu.Lock()
	defer g.mu.Unlock()
	fn(g)
}

// TestContextCancelledBeforeKeyIsFreed is the regression test for issue 9
// item 10: when Release, Close or Do frees a key at the authority (after
// which another client can hold it), the lease's context, and the context
// Do gave its work, are already done.
func TestContextCancelledBeforeKeyIsFreed(t *testing.T) {
	ctx := context.Background()
	store := mem.NewStore(nil)
	g := newGate(store)
	c := fenced.NewClient(g, nil)
	defer c.Close()
	other := fenced.NewClient(store.Driver(), nil)
	defer other.Close()

	var (
		mu      sync.Mutex
		live    = map[string]context.Context{} // owner -> context that must be done at release
		checked int
	)
	g.set(func(g *gate) {
		g.beforeRelease = func(gr driver.Grant) {
			mu.Lock()
			defer mu.Unlock()
			if wctx, ok := live[gr.Owner]; ok {
				checked++
				if wctx.Err() == nil {
					t.Errorf("key %q is being freed while the work's context is live", gr.Key)
				}
			}
		}
	})
	watch := func(l *fenced.Lease, wctx context.Context) {
		mu.Lock()
		defer mu.Unlock()
		live[l.Owner()] = wctx
	}

	// Release.
	l, err := c.TryAcquire(ctx, "job:release", nil)
	if err != nil {
		t.Fatal(err)
	}
	watch(l, l.Context())
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := other.TryAcquire(ctx, "job:release", nil); err != nil {
		t.Fatalf("another client after Release: %v", err)
	}

	// Do: the context fn got (which goroutines it started may still use).
	err = c.Do(ctx, "job:do", nil, func(wctx context.Context, l *fenced.Lease) error {
		watch(l, wctx)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// Close.
	var closing []*fenced.Lease
	for _, key := range []string{"job:close:1", "job:close:2"} {
		l, err := c.TryAcquire(ctx, key, nil)
		if err != nil {
			t.Fatal(err)
		}
		watch(l, l.Context())
		closing = append(closing, l)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for _, l := range closing {
		if !errors.Is(l.Err(), fenced.ErrClosed) {
			t.Errorf("%s after Close: %v, want ErrClosed", l.Key(), l.Err())
		}
		if _, err := other.TryAcquire(ctx, l.Key(), nil); err != nil {
			t.Errorf("another client after Close: %v; Close must release its leases", err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if checked != 4 {
		t.Fatalf("%d releases checked, want 4", checked)
	}
}

// TestGrantDuringCloseIsReleased is the regression test for the second
// half of issue 9 item 10: a grant the authority makes while Close runs is
// released, and its Acquire reports ErrClosed instead of a lease.
func TestGrantDuringCloseIsReleased(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store := mem.NewStore(nil)
	g := newGate(store)
	g.holdGrantOf = "job:racing"
	c := fenced.NewClient(g, nil)

	type result struct {
		l   *fenced.Lease
		err error
	}
	acquired := make(chan result, 1)
	go func() {
		l, err := c.Acquire(ctx, "job:racing", nil)
		acquired <- result{l, err}
	}()
	select {
	case <-g.granted: // the authority granted the key; the answer is on its way
	case <-ctx.Done():
		t.Fatal("no grant")
	}
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	for {
		if _, err := c.TryAcquire(ctx, "probe", nil); errors.Is(err, fenced.ErrClosed) {
			break // Close has begun
		}
		time.Sleep(time.Millisecond)
	}
	close(g.proceed)
	r := <-acquired
	if r.err == nil {
		t.Errorf("Acquire completing during Close returned a lease (fence %d, err %v); want ErrClosed", r.l.Fence(), r.l.Err())
	} else if !errors.Is(r.err, fenced.ErrClosed) {
		t.Errorf("Acquire completing during Close: %v, want ErrClosed", r.err)
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	info, err := store.Driver().Inspect(ctx, "job:racing")
	if err != nil || info.Held {
		t.Fatalf("after Close the racing grant is %+v, %v; want released", info, err)
	}
}

// TestCloseIsBoundedWithHungAuthority is the regression test for issue 9
// item 12: with an authority that never answers a release or a renewal,
// Close returns after Options.CloseTimeout, every lease's context is done
// by then, and the error says the outcome is unknown.
func TestCloseIsBoundedWithHungAuthority(t *testing.T) {
	clk := clock.NewFake(time.Unix(1000, 0))
	store := mem.NewStore(clk)
	g := newGate(store)
	t.Cleanup(func() { close(g.hang) }) // let the hung requests go when the test ends
	c := fenced.NewClient(g, &fenced.Options{Clock: clk, CloseTimeout: 200 * time.Millisecond})
	ctx := context.Background()
	var leases []*fenced.Lease
	for _, key := range []string{"hung:1", "hung:2"} {
		l, err := c.TryAcquire(ctx, key, &fenced.LeaseOptions{TTL: 3 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	// A renewal is in flight and never answered; so will the releases be.
	g.set(func(g *gate) { g.hangRenew, g.hangRelease = true, true })
	advance(clk, 1100*time.Millisecond, 100*time.Millisecond)

	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	select {
	case err := <-closed:
		if !errors.Is(err, fenced.ErrUnknownOutcome) {
			t.Errorf("Close with a hung authority: %v, want ErrUnknownOutcome", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Close still blocked 30s after its 200ms CloseTimeout, with the authority hung")
	}
	for _, l := range leases {
		if !errors.Is(l.Err(), fenced.ErrClosed) {
			t.Errorf("%s after Close returned: %v, want its context done with ErrClosed", l.Key(), l.Err())
		}
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close: %v, want nil", err)
	}
}
