// Package drivertest is the conformance suite every fenced backend runs
// against a real server. A backend needs no other tests for the core
// semantics: mutual exclusion, fence monotonicity, ownership, expiry,
// waiting, cancellation, the operator's side (list, break) and bad input.
//
// A backend's test calls RunConformanceTests with a Harness that opens
// drivers on one store (each Open is a new connection, as another process
// would make). It passes the same Harness to recipe/recipetest, the kit of
// the recipes; drivertest does not import recipe. Key, Context and
// Harness.Client are the pieces that kit shares with it.
//
// Every capability a driver declares is verified, not trusted.
// Notification (Capabilities.Subscribe or Queue): a waiter is woken by the release, not
// by polling. Capabilities.FIFO: waiters are granted the key in the order
// they arrived. driver.LossWatcher: a grant broken by someone else is
// reported without being asked. driver.BatchRenewer: one batch renews
// exactly the current grants. A capability the driver does not declare is skipped with t.Skip
// naming it; that is the only skip in the suite, so a PASS means every
// declared capability was seen to work.
package drivertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/fenced-dev/fenced/internal/core/limits"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/clock"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/core/capability"
	"github.com/fenced-dev/fenced/internal/core/rootaccess"
)

// Harness tells the suite how to reach the store under test.
type Harness struct {
	// Open returns a new driver on the store under test. Every call must
	// reach the same store, as a separate client would; the suite closes
	// what it opens.
	Open func(t *testing.T) driver.Driver
	// OpenWithClock, if set, returns a driver whose expiry follows clk; the
	// suite then drives expiry by advancing clk instead of sleeping. Calls
	// with the same clk must reach the same store.
	OpenWithClock func(t *testing.T, clk clock.Clock) driver.Driver
	// ShortTTL is the shortest TTL the backend honours reliably; expiry
	// tests sleep about this long. Default 300ms.
	ShortTTL time.Duration
	// BadURLs are malformed store URLs for the backend's scheme; each must
	// make fenced.Open fail with an error matching fenced.ErrInvalidURL.
	BadURLs []string
	// Workers and Rounds size the mutual-exclusion test. Defaults 6 and 15.
	Workers, Rounds int
	// MinFence becomes Options.MinFence of every client the suite opens
	// (unless a test sets its own). Backends whose fence is weaker than
	// strict set it (FenceRepeatable or FenceNone), since the suite's
	// leases leave MinFence to the client, whose default is FenceStrict.
	MinFence fenced.FenceStrength
}

func (h *Harness) defaults() {
	if h.ShortTTL == 0 {
		h.ShortTTL = 300 * time.Millisecond
	}
	if h.Workers == 0 {
		h.Workers = 6
	}
	if h.Rounds == 0 {
		h.Rounds = 15
	}
}

// RunConformanceTests runs the whole suite as subtests of t.
func RunConformanceTests(t *testing.T, h Harness) {
	h.defaults()
	s := &suite{h: h}
	t.Run("MutualExclusion", s.testMutualExclusion)
	t.Run("ReacquireBySameOwnerIsIdempotent", s.testIdempotentReacquire)
	t.Run("RenewAndReleaseOnlyByOwner", s.testOwnership)
	t.Run("WaitAndMaxWait", s.testWait)
	t.Run("TryAcquire", s.testTryAcquire)
	t.Run("CancelWhileWaiting", s.testCancel)
	t.Run("CancelledAcquireLeavesNoGrant", s.testCancelledAcquireLeavesNoGrant)
	t.Run("ListInspectBreak", s.testListInspectBreak)
	t.Run("BreakCancelsHolder", s.testBreakCancelsHolder)
	t.Run("DoSkipsOrWaits", s.testDo)
	t.Run("BadInputChangesNothing", s.testBadInput)
	if len(h.BadURLs) > 0 {
		t.Run("BadURLs", s.testBadURLs)
	}
	t.Run("NotifiedWaiterIsWokenWithoutPolling", s.testNotify)
	t.Run("WaiterGivingUpMidLookStrandsNobody", s.testGiveUpMidLook)
	t.Run("FIFOWaitersServedInArrivalOrder", s.testFIFO)
	t.Run("ObserverWokenByReleaseAndBreak", s.testObserve)
	t.Run("LossWatchReportsBreak", s.testLossWatch)
	t.Run("BlockedDriverDelaysNoLeaseEnd", s.testBlockedDriverDelaysNoEnd)
	// These mostly wait out TTLs, each on keys and clients of its own:
	// they run at once, whatever -parallel says, to keep the suite short.
	t.Run("Timed", func(t *testing.T) {
		var wg sync.WaitGroup
		for name, test := range map[string]func(*testing.T){
			"FenceIncreasesAcrossReleaseExpiryBreakReopen": s.testFenceMonotonic,
			"StaleGrantCannotReleaseNewHolder":             s.testStaleGrant,
			"ExpiryLetsNewHolderIn":                        s.testExpiry,
			"AutoRenewKeepsLease":                          s.testAutoRenew,
			"WaitLongerThanTTLGivesFullLease":              s.testLongWait,
			"BatchRenewReportsEachGrant":                   s.testBatchRenew,
			"CheckpointUnderTheFence":                      s.testCheckpoint,
		} {
			wg.Go(func() { t.Run(name, test) })
		}
		wg.Wait()
	})
	t.Run("CapabilitiesMatchMethods", s.testCapabilities)
}

// skipUndeclared skips t because the backend does not declare capability;
// the only kind of skip the suite has.
func skipUndeclared(t *testing.T, capability, otherwise string) {
	t.Helper()
	t.Skipf("capability %s not declared by this backend (%s)", capability, otherwise)
}

type suite struct{ h Harness }

// Key returns a key no other test (or earlier run against a durable store)
// has used. It starts with "dt:" and name.
func Key(name string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("dt:%s:%s", name, hex.EncodeToString(b[:]))
}

// Client returns a client on a new driver from h.Open, closed when t ends.
// Its MinFence is h.MinFence unless opts sets one; nil opts are the
// defaults.
func (h Harness) Client(t *testing.T, opts *fenced.Options) *fenced.Client {
	t.Helper()
	return h.clientOn(t, h.Open(t), opts)
}

// clientOn is Client on the driver d, which the client closes.
func (h Harness) clientOn(t *testing.T, d driver.Driver, opts *fenced.Options) *fenced.Client {
	t.Helper()
	var o fenced.Options
	if opts != nil {
		o = *opts
	}
	if o.MinFence == 0 { // unset: the harness says
		o.MinFence = h.MinFence
	}
	c := fenced.NewClient(d, &o)
	t.Cleanup(func() { c.Close() })
	return c
}

func (s *suite) drv(t *testing.T) driver.Driver {
	t.Helper()
	d := s.h.Open(t)
	t.Cleanup(func() { d.Close() })
	return d
}

// Context returns the context of one test: cancelled when t ends, and
// after a minute.
func Context(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// context returns a context for a test of s whose length scales with
// its ShortTTL: Context's minute, or ten ShortTTLs where that is more (a
// TTL measured on a busy machine was 21.9s, and 3 TTLs outlived a minute).
func (s *suite) context(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), max(60*time.Second, 10*s.h.ShortTTL))
	t.Cleanup(cancel)
	return ctx
}

func owner() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func (s *suite) testMutualExclusion(t *testing.T) {
	ctx := Context(t)
	key := Key("mutex")
	var inside atomic.Int32
	var mu sync.Mutex
	var fences []uint64
	var wg sync.WaitGroup
	errs := make(chan error, s.h.Workers*s.h.Rounds)
	for w := 0; w < s.h.Workers; w++ {
		c := s.h.Client(t, &fenced.Options{MinBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond})
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := 0; r < s.h.Rounds; r++ {
				err := c.Do(ctx, key, &fenced.LeaseOptions{TTL: 10 * time.Second, MaxWait: 30 * time.Second},
					func(ctx context.Context, l *fenced.Lease) error {
						if n := inside.Add(1); n != 1 {
							return fmt.Errorf("%d holders inside the critical section at once", n)
						}
						mu.Lock()
						fences = append(fences, l.Fence())
						mu.Unlock()
						time.Sleep(time.Millisecond)
						inside.Add(-1)
						return nil
					})
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if want := s.h.Workers * s.h.Rounds; len(fences) != want {
		t.Fatalf("%d grants, want %d", len(fences), want)
	}
	for i := 1; i < len(fences); i++ {
		if fences[i] <= fences[i-1] {
			t.Fatalf("grant %d got fence %d after fence %d: fences must strictly increase", i, fences[i], fences[i-1])
		}
	}
}

// expire makes a grant of ttl expire, by sleeping or by advancing clk.
func (s *suite) expire(clk *clock.Fake, ttl time.Duration) {
	if clk != nil {
		clk.Advance(ttl + time.Millisecond)
		return
	}
	time.Sleep(ttl + ttl/2 + 50*time.Millisecond)
}

// expiryDriver returns a driver for expiry tests and the fake clock that
// drives it (nil when the suite must sleep).
func (s *suite) expiryDriver(t *testing.T) (driver.Driver, *clock.Fake) {
	if s.h.OpenWithClock != nil {
		clk := clock.NewFake(time.Now())
		d := s.h.OpenWithClock(t, clk)
		t.Cleanup(func() { d.Close() })
		return d, clk
	}
	return s.drv(t), nil
}

func (s *suite) testFenceMonotonic(t *testing.T) {
	ctx := Context(t)
	key := Key("fence")
	d, clk := s.expiryDriver(t)
	ttl := s.h.ShortTTL
	var last uint64
	step := func(what string, f uint64) {
		t.Helper()
		if f <= last {
			t.Fatalf("after %s: fence %d, want > %d", what, f, last)
		}
		last = f
	}
	o1 := owner()
	f, err := d.TryAcquire(ctx, key, o1, ttl)
	if err != nil {
		t.Fatal(err)
	}
	step("first grant", f)
	if err := d.Release(ctx, driver.Grant{Key: key, Owner: o1, Fence: f}); err != nil {
		t.Fatal(err)
	}
	f, err = d.TryAcquire(ctx, key, owner(), ttl)
	if err != nil {
		t.Fatal(err)
	}
	step("release", f)
	s.expire(clk, ttl)
	f, err = d.TryAcquire(ctx, key, owner(), time.Minute)
	if err != nil {
		t.Fatalf("acquire after expiry: %v", err)
	}
	step("expiry", f)
	if _, err := d.Break(ctx, key, "conformance", "drivertest"); err != nil {
		t.Fatal(err)
	}
	o := owner()
	f, err = d.TryAcquire(ctx, key, o, time.Minute)
	if err != nil {
		t.Fatalf("acquire after break: %v", err)
	}
	step("break", f)
	if err := d.Release(ctx, driver.Grant{Key: key, Owner: o, Fence: f}); err != nil {
		t.Fatal(err)
	}
	d.Close()
	var d2 driver.Driver
	if clk != nil {
		d2 = s.h.OpenWithClock(t, clk)
		t.Cleanup(func() { d2.Close() })
	} else {
		d2 = s.drv(t)
	}
	f, err = d2.TryAcquire(ctx, key, owner(), time.Minute)
	if err != nil {
		t.Fatalf("acquire after reopen: %v", err)
	}
	step("reopening the store", f)
}

func (s *suite) testIdempotentReacquire(t *testing.T) {
	ctx := Context(t)
	d := s.drv(t)
	key := Key("idem")
	o := owner()
	f1, err := d.TryAcquire(ctx, key, o, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	f2, err := d.TryAcquire(ctx, key, o, time.Minute)
	if err != nil {
		t.Fatalf("re-acquire by the holding owner: %v", err)
	}
	if f2 != f1 {
		t.Fatalf("re-acquire by the holding owner returned fence %d, want the same %d", f2, f1)
	}
	if _, err := d.TryAcquire(ctx, key, owner(), time.Minute); !errors.Is(err, fenced.ErrHeld) {
		t.Fatalf("acquire by another owner: %v, want ErrHeld", err)
	}
}

func (s *suite) testOwnership(t *testing.T) {
	ctx := Context(t)
	d := s.drv(t)
	key := Key("own")
	o := owner()
	f, err := d.TryAcquire(ctx, key, o, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	bad := []driver.Grant{
		{Key: key, Owner: owner(), Fence: f, TTL: time.Minute}, // another owner
		{Key: key, Owner: o, Fence: f + 1, TTL: time.Minute},   // our owner, wrong fence
		{Key: key, Owner: o, Fence: f - 1, TTL: time.Minute},   // our owner, older fence
		{Key: key, Owner: "", Fence: f, TTL: time.Minute},      // no owner
		{Key: key + "x", Owner: o, Fence: f, TTL: time.Minute}, // another key
	}
	for _, g := range bad {
		if err := d.Renew(ctx, g); !errors.Is(err, fenced.ErrNotHeld) {
			t.Errorf("Renew(%v) = %v, want ErrNotHeld", g, err)
		}
		if err := d.Release(ctx, g); !errors.Is(err, fenced.ErrNotHeld) {
			t.Errorf("Release(%v) = %v, want ErrNotHeld", g, err)
		}
	}
	info, err := d.Inspect(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if !info.Held || info.Fence != f {
		t.Fatalf("after refused renew/release: %+v, want held with fence %d", info, f)
	}
	g := driver.Grant{Key: key, Owner: o, Fence: f, TTL: time.Minute}
	if err := d.Renew(ctx, g); err != nil {
		t.Fatalf("renew by owner: %v", err)
	}
	// A grant built without its TTL is refused, not renewed for nothing.
	noTTL := g
	noTTL.TTL = 0
	if err := d.Renew(ctx, noTTL); !errors.Is(err, fenced.ErrInvalidTTL) {
		t.Errorf("renew of a grant without its TTL: %v, want ErrInvalidTTL", err)
	}
	if br := capability.Of(d).BatchRenewer; br != nil {
		errs, err := br.RenewBatch(ctx, []driver.Grant{noTTL})
		if err == nil && len(errs) == 1 {
			err = errs[0]
		}
		if !errors.Is(err, fenced.ErrInvalidTTL) {
			t.Errorf("batch renewal of a grant without its TTL: %v, want ErrInvalidTTL", err)
		}
	}
	if info, err := d.Inspect(ctx, key); err != nil || !info.Held || info.Fence != f {
		t.Fatalf("after renewals without a TTL: %+v, %v; want still held with fence %d", info, err, f)
	}
	if err := d.Release(ctx, g); err != nil {
		t.Fatalf("release by owner: %v", err)
	}
	if err := d.Release(ctx, g); !errors.Is(err, fenced.ErrNotHeld) {
		t.Fatalf("second release: %v, want ErrNotHeld", err)
	}
	if err := d.Renew(ctx, g); !errors.Is(err, fenced.ErrNotHeld) {
		t.Fatalf("renew after release: %v, want ErrNotHeld", err)
	}
}

func (s *suite) testStaleGrant(t *testing.T) {
	ctx := Context(t)
	d, clk := s.expiryDriver(t)
	key := Key("stale")
	ttl := s.h.ShortTTL
	a := owner()
	fa, err := d.TryAcquire(ctx, key, a, ttl)
	if err != nil {
		t.Fatal(err)
	}
	s.expire(clk, ttl)
	b := owner()
	fb, err := d.TryAcquire(ctx, key, b, time.Minute)
	if err != nil {
		t.Fatalf("B acquire after A expired: %v", err)
	}
	stale := driver.Grant{Key: key, Owner: a, Fence: fa, TTL: ttl}
	if err := d.Release(ctx, stale); !errors.Is(err, fenced.ErrNotHeld) {
		t.Fatalf("A's stale release: %v, want ErrNotHeld", err)
	}
	if err := d.Renew(ctx, stale); !errors.Is(err, fenced.ErrNotHeld) {
		t.Fatalf("A's stale renew: %v, want ErrNotHeld", err)
	}
	info, err := d.Inspect(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if !info.Held || info.Fence != fb {
		t.Fatalf("B's grant after A's stale release: %+v, want held with fence %d", info, fb)
	}
	// The same owner token granted again: its old grant's fence must not
	// release the new grant.
	if err := d.Release(ctx, driver.Grant{Key: key, Owner: b, Fence: fb}); err != nil {
		t.Fatal(err)
	}
	f2, err := d.TryAcquire(ctx, key, a, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Release(ctx, stale); !errors.Is(err, fenced.ErrNotHeld) {
		t.Fatalf("release with A's old fence %d while A holds fence %d: %v, want ErrNotHeld", fa, f2, err)
	}
	if info, _ := d.Inspect(ctx, key); !info.Held || info.Fence != f2 {
		t.Fatalf("A's new grant after release with its old fence: %+v", info)
	}
}

// tryResolved is TryAcquire asked again by the same owner while the
// outcome is unknown (a loaded etcd answers "request timed out"), as the
// Client resolves it: the owner's repeat returns its grant if one was
// made. It gives up after 5 asks.
func tryResolved(ctx context.Context, d driver.Driver, key, owner string, ttl time.Duration) (uint64, error) {
	for i := 1; ; i++ {
		f, err := d.TryAcquire(ctx, key, owner, ttl)
		if !errors.Is(err, fenced.ErrUnknownOutcome) || i == 5 {
			return f, err
		}
	}
}

func (s *suite) testExpiry(t *testing.T) {
	ctx := Context(t)
	d, clk := s.expiryDriver(t)
	ttl := s.h.ShortTTL
	var key string
	var fa uint64
	for round := 1; ; round++ {
		key = Key("expiry")
		asked := time.Now()
		f, err := d.TryAcquire(ctx, key, owner(), ttl)
		if err != nil {
			t.Fatal(err)
		}
		_, err = d.TryAcquire(ctx, key, owner(), ttl)
		if errors.Is(err, fenced.ErrHeld) {
			fa = f
			break
		}
		// A grant answered a TTL after the first was asked for may be
		// right: the first had run out. Before that, it is a second holder.
		if took := time.Since(asked); err == nil && clk == nil && took >= ttl && round < 3 {
			t.Logf("round %d: the second try came %v after the first was asked for, past the TTL %v: too busy to tell; again",
				round, took.Round(time.Millisecond), ttl)
			continue
		}
		t.Fatalf("acquire before expiry: %v, want ErrHeld", err)
	}
	s.expire(clk, ttl)
	if l, err := d.List(ctx, key); err != nil || len(l) != 0 {
		t.Fatalf("List after expiry = %v, %v; want no held lease", l, err)
	}
	fb, err := tryResolved(ctx, d, key, owner(), ttl)
	if err != nil {
		t.Fatalf("acquire after expiry: %v", err)
	}
	if fb <= fa {
		t.Fatalf("fence after expiry %d, want > %d", fb, fa)
	}
}

func (s *suite) testAutoRenew(t *testing.T) {
	ctx := s.context(t)
	key := Key("renew")
	// At least a second, so a renewal every third of it still lands on a
	// loaded machine; the test checks renewal, not the shortest TTL.
	ttl := max(s.h.ShortTTL, time.Second)
	var renewals atomic.Int32
	c2 := s.h.Client(t, &fenced.Options{})
	c := s.h.Client(t, &fenced.Options{Hook: func(e fenced.Event) {
		if e.Kind == fenced.EventRenew {
			if e.Err == nil {
				renewals.Add(1)
			}
		}
	}})
	l, err := c.TryAcquire(ctx, key, &fenced.LeaseOptions{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * ttl)
	if err := l.Err(); err != nil {
		t.Fatalf("lease ended despite auto-renewal: %v", err)
	}
	if renewals.Load() < 3 {
		t.Fatalf("%d renewals in 3 TTLs, want at least 3", renewals.Load())
	}
	tried := time.Now()
	if l2, err := c2.TryAcquire(ctx, key, &fenced.LeaseOptions{TTL: ttl}); !errors.Is(err, fenced.ErrHeld) {
		if err == nil && l.Err() == nil && rootaccess.ValidUntil(l).After(tried) {
			t.Fatalf("TWO VALID HOLDERS: another client got fence %d while the renewed lease (fence %d) was valid until %v",
				l2.Fence(), l.Fence(), rootaccess.ValidUntil(l))
		}
		t.Fatalf("another client acquired a renewed lease: %v (renewal fell behind: lease %v)", err, l.Err())
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(l.Err(), fenced.ErrReleased) {
		t.Fatalf("lease cause after release = %v, want ErrReleased", l.Err())
	}
}

func (s *suite) testWait(t *testing.T) {
	ctx := Context(t)
	a := s.h.Client(t, nil)
	b := s.h.Client(t, &fenced.Options{MinBackoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	key := Key("wait")
	la, err := a.TryAcquire(ctx, key, &fenced.LeaseOptions{TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// MaxWait runs out while A holds.
	start := time.Now()
	_, err = b.Acquire(ctx, key, &fenced.LeaseOptions{MaxWait: 200 * time.Millisecond})
	if !errors.Is(err, fenced.ErrHeld) {
		t.Fatalf("Acquire with MaxWait while held: %v, want ErrHeld", err)
	}
	if waited := time.Since(start); waited < 200*time.Millisecond {
		t.Fatalf("gave up after %v, before MaxWait 200ms", waited)
	}
	// A waiter gets the key once A releases.
	released := make(chan time.Time, 1)
	go func() {
		time.Sleep(150 * time.Millisecond)
		released <- time.Now()
		la.Release(ctx)
	}()
	lb, err := b.Acquire(ctx, key, &fenced.LeaseOptions{MaxWait: 20 * time.Second})
	if err != nil {
		t.Fatalf("waiter: %v", err)
	}
	defer lb.Release(ctx)
	if got := time.Now(); got.Before(<-released) {
		t.Fatal("waiter acquired before the holder released")
	}
	if lb.Fence() <= la.Fence() {
		t.Fatalf("waiter's fence %d, want > %d", lb.Fence(), la.Fence())
	}
}

func (s *suite) testTryAcquire(t *testing.T) {
	ctx := Context(t)
	a, b := s.h.Client(t, nil), s.h.Client(t, nil)
	key := Key("try")
	la, err := a.TryAcquire(ctx, key, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.TryAcquire(ctx, key, &fenced.LeaseOptions{MaxWait: time.Minute})
	if !errors.Is(err, fenced.ErrHeld) {
		t.Fatalf("TryAcquire on a held key: %v, want ErrHeld", err)
	}
	if !strings.Contains(err.Error(), key) {
		t.Fatalf("error %q does not name the key", err)
	}
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lb, err := b.TryAcquire(ctx, key, nil)
	if err != nil {
		t.Fatalf("TryAcquire after release: %v", err)
	}
	lb.Release(ctx)
}

func (s *suite) testCancel(t *testing.T) {
	ctx := Context(t)
	a, b := s.h.Client(t, nil), s.h.Client(t, nil)
	key := Key("cancel")
	la, err := a.TryAcquire(ctx, key, nil)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(100*time.Millisecond, cancel)
	_, err = b.Acquire(wctx, key, &fenced.LeaseOptions{MaxWait: fenced.WaitForever})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled waiter: %v, want context.Canceled", err)
	}
	info, err := a.Inspect(ctx, key)
	if err != nil || !info.Held || info.Fence != la.Fence() {
		t.Fatalf("holder after a cancelled waiter: %+v, %v", info, err)
	}
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Nothing of the cancelled waiter is left holding or queued.
	lc, err := a.TryAcquire(ctx, key, nil)
	if err != nil {
		t.Fatalf("acquire after the cancelled waiter left: %v", err)
	}
	lc.Release(ctx)
}

func (s *suite) testBreakCancelsHolder(t *testing.T) {
	ctx := Context(t)
	// The operator breaks through a client of its own.
	holder, opDrv := s.h.Client(t, nil), s.h.Open(t)
	operator := s.h.clientOn(t, opDrv, nil)
	key := Key("breakholder")
	ttl := s.h.ShortTTL
	l, err := holder.TryAcquire(ctx, key, &fenced.LeaseOptions{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := operator.Break(ctx, key, "evict", "drivertest"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Context().Done():
	case <-time.After(10 * ttl):
		t.Fatal("the holder's lease context was not cancelled after a break")
	}
	if !errors.Is(l.Err(), fenced.ErrLost) && !errors.Is(l.Err(), fenced.ErrExpired) {
		t.Fatalf("cause = %v, want ErrLost", l.Err())
	}
	l2, err := operator.TryAcquire(ctx, key, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Release(ctx)
	if l2.Fence() <= l.Fence() {
		t.Fatalf("fence after break %d, want > %d", l2.Fence(), l.Fence())
	}
	if err := l.Release(ctx); !errors.Is(err, fenced.ErrNotHeld) {
		t.Fatalf("evicted holder's release: %v, want ErrNotHeld", err)
	}
	if info, _ := operator.Inspect(ctx, key); !info.Held || info.Fence != l2.Fence() {
		t.Fatalf("evicted holder's release touched the new grant: %+v", info)
	}
}

func (s *suite) testDo(t *testing.T) {
	ctx := Context(t)
	a, b := s.h.Client(t, nil), s.h.Client(t, nil)
	key := Key("do")
	ran := false
	err := a.Do(ctx, key, nil, func(ctx context.Context, l *fenced.Lease) error {
		ran = true
		if l.Fence() == 0 || ctx.Err() != nil {
			return fmt.Errorf("bad lease in Do: fence %d, ctx %v", l.Fence(), ctx.Err())
		}
		// While we hold it, a skipping worker skips...
		err := b.Do(ctx, key, nil, func(context.Context, *fenced.Lease) error {
			return errors.New("second worker ran while the first held the key")
		})
		if !errors.Is(err, fenced.ErrHeld) {
			return fmt.Errorf("skipping worker: %v, want ErrHeld", err)
		}
		return nil
	})
	if err != nil || !ran {
		t.Fatalf("Do = %v, ran = %v", err, ran)
	}
	// ...and a waiting worker runs once the key is free.
	la, err := a.TryAcquire(ctx, key, nil)
	if err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(100*time.Millisecond, func() { la.Release(context.Background()) })
	ran = false
	err = b.Do(ctx, key, &fenced.LeaseOptions{MaxWait: 20 * time.Second}, func(ctx context.Context, l *fenced.Lease) error {
		ran = true
		if l.Fence() <= la.Fence() {
			return fmt.Errorf("fence %d not above %d", l.Fence(), la.Fence())
		}
		return nil
	})
	if err != nil || !ran {
		t.Fatalf("waiting Do = %v, ran = %v", err, ran)
	}
	if info, _ := a.Inspect(ctx, key); info.Held {
		t.Fatalf("Do left the lease held: %+v", info)
	}
	// A function error comes back unchanged and the lease is released.
	boom := errors.New("boom")
	if err := a.Do(ctx, key, nil, func(context.Context, *fenced.Lease) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("Do returned %v, want the function's error", err)
	}
	if info, _ := a.Inspect(ctx, key); info.Held {
		t.Fatalf("Do left the lease held after an error: %+v", info)
	}
}

func (s *suite) testBadInput(t *testing.T) {
	ctx := Context(t)
	c := s.h.Client(t, nil)
	key := Key("bad")
	before, err := c.List(ctx, "dt:")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		key  string
		opts fenced.LeaseOptions
		want error
	}{
		{"empty key", "", fenced.LeaseOptions{}, fenced.ErrInvalidKey},
		{"oversized key", strings.Repeat("k", limits.MaxKeyLen+1), fenced.LeaseOptions{}, fenced.ErrInvalidKey},
		{"control character", key + "\x00", fenced.LeaseOptions{}, fenced.ErrInvalidKey},
		{"newline", key + "\nx", fenced.LeaseOptions{}, fenced.ErrInvalidKey},
		{"invalid UTF-8", key + "\xff", fenced.LeaseOptions{}, fenced.ErrInvalidKey},
		{"leading space", " " + key, fenced.LeaseOptions{}, fenced.ErrInvalidKey},
		{"negative TTL", key, fenced.LeaseOptions{TTL: -time.Second}, fenced.ErrInvalidTTL},
		{"tiny TTL", key, fenced.LeaseOptions{TTL: time.Nanosecond}, fenced.ErrInvalidTTL},
		{"absurd TTL", key, fenced.LeaseOptions{TTL: 100 * 365 * 24 * time.Hour}, fenced.ErrInvalidTTL},
		{"negative MaxWait", key, fenced.LeaseOptions{MaxWait: -5 * time.Second}, fenced.ErrInvalidTTL},
		{"renew slower than TTL", key, fenced.LeaseOptions{TTL: time.Second, RenewEvery: 2 * time.Second}, fenced.ErrInvalidTTL},
	}
	for _, tc := range cases {
		_, err := c.TryAcquire(ctx, tc.key, &tc.opts)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: TryAcquire error %v, want %v", tc.name, err, tc.want)
		}
		_, err = c.Acquire(ctx, tc.key, &tc.opts)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: Acquire error %v, want %v", tc.name, err, tc.want)
		}
	}
	if _, err := c.Inspect(ctx, ""); !errors.Is(err, fenced.ErrInvalidKey) {
		t.Errorf("Inspect(\"\"): %v, want ErrInvalidKey", err)
	}
	if _, err := c.Break(ctx, "", "x", "y"); !errors.Is(err, fenced.ErrInvalidKey) {
		t.Errorf("Break(\"\"): %v, want ErrInvalidKey", err)
	}
	if _, err := c.Inspect(ctx, key); !errors.Is(err, fenced.ErrNotFound) {
		t.Errorf("bad input left key %q in the store: Inspect = %v", key, err)
	}
	after, err := c.List(ctx, "dt:")
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range after {
		if strings.HasPrefix(i.Key, key) || strings.HasPrefix(strings.TrimSpace(i.Key), key) {
			t.Errorf("bad input created lease %+v", i)
		}
	}
	_ = before
}

func (s *suite) testBadURLs(t *testing.T) {
	ctx := Context(t)
	for _, u := range s.h.BadURLs {
		c, err := fenced.Open(ctx, u, nil)
		if err == nil {
			c.Close()
			t.Errorf("Open(%q) succeeded, want an error", u)
			continue
		}
		if !errors.Is(err, fenced.ErrInvalidURL) {
			t.Errorf("Open(%q) = %v, want ErrInvalidURL", u, err)
		}
	}
}

// testNotify checks that a backend declaring Notify wakes a waiter in
// another client on release although that waiter would otherwise sleep far
// longer than the test allows.
func (s *suite) testNotify(t *testing.T) {
	d := s.drv(t)
	if !capability.Of(d).Notifies() {
		skipUndeclared(t, "Notify (Capabilities.Subscribe or Queue)", "waiters poll with backoff")
	}
	ctx := Context(t)
	a := s.h.Client(t, nil)
	b := s.h.Client(t, &fenced.Options{MinBackoff: time.Minute, MaxBackoff: time.Minute, FallbackPoll: time.Minute})
	key := Key("notify")
	la, err := a.TryAcquire(ctx, key, &fenced.LeaseOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		lb, err := b.Acquire(ctx, key, &fenced.LeaseOptions{MaxWait: 30 * time.Second})
		if err == nil {
			lb.Release(ctx)
		}
		got <- err
	}()
	time.Sleep(200 * time.Millisecond)
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("waiter not woken by the release within 20s although polling was set to once a minute")
	}
}

// testFIFO checks that a backend declaring FIFO grants a released key to
// its waiters in the order they started waiting, each in another client.
// The waiters arrive half a second apart, so that their order is clear
// whatever the machine's load; each holds the key briefly and releases it.
func (s *suite) testFIFO(t *testing.T) {
	if !capability.Of(s.drv(t)).Declared.FIFO {
		skipUndeclared(t, "FIFO (Capabilities.FIFO)", "waiters are not served in arrival order")
	}
	ctx := Context(t)
	key := Key("fifo")
	holder, err := s.h.Client(t, nil).TryAcquire(ctx, key, &fenced.LeaseOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	const waiters = 3
	served := make(chan int, waiters)
	failed := make(chan error, waiters)
	for i := range waiters {
		c := s.h.Client(t, &fenced.Options{MinBackoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
		go func() {
			l, err := c.Acquire(ctx, key, &fenced.LeaseOptions{TTL: time.Minute, MaxWait: 45 * time.Second})
			if err != nil {
				failed <- fmt.Errorf("waiter %d: %w", i, err)
				return
			}
			served <- i
			time.Sleep(50 * time.Millisecond)
			if err := l.Release(ctx); err != nil {
				failed <- fmt.Errorf("waiter %d release: %w", i, err)
			}
		}()
		time.Sleep(500 * time.Millisecond)
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var order []int
	for len(order) < waiters {
		select {
		case i := <-served:
			order = append(order, i)
		case err := <-failed:
			t.Fatal(err)
		case <-ctx.Done():
			t.Fatalf("waiters served so far %v: %v", order, ctx.Err())
		}
	}
	for i, w := range order {
		if w != i {
			t.Fatalf("backend declares FIFO, but waiters that arrived in order 0..%d were served in order %v", waiters-1, order)
		}
	}
}

// testLossWatch checks a driver implementing driver.LossWatcher. It must
// report a grant broken by another client exactly once, with an error
// matching fenced.ErrLost. It must report nothing while the grant is held,
// and nothing after the watch's stop. It must refuse to watch a grant it
// does not hold.
func (s *suite) testLossWatch(t *testing.T) {
	d := s.drv(t)
	w := capability.Of(d).LossWatcher
	if w == nil {
		skipUndeclared(t, "WatchLoss (driver.LossWatcher)", "a lost grant is found by the next renewal")
	}
	ctx := Context(t)
	grant := func(name string) driver.Grant {
		g := driver.Grant{Key: Key(name), Owner: owner(), TTL: time.Minute}
		var err error
		if g.Fence, err = d.TryAcquire(ctx, g.Key, g.Owner, g.TTL); err != nil {
			t.Fatal(err)
		}
		return g
	}
	watch := func(g driver.Grant) (<-chan error, func()) {
		reports := make(chan error, 4)
		stop, err := w.WatchLoss(g, func(err error) { reports <- err })
		if err != nil {
			t.Fatalf("WatchLoss(%s): %v", g, err)
		}
		return reports, stop
	}
	breakKey := func(key string) {
		if _, err := s.drv(t).Break(ctx, key, "drivertest loss watch", "drivertest"); err != nil {
			t.Fatalf("break %s: %v", key, err)
		}
	}
	g := grant("losswatch")
	reports, stop := watch(g)
	defer stop()
	stranger := g
	stranger.Owner = owner()
	if stop, err := w.WatchLoss(stranger, func(error) {}); !errors.Is(err, fenced.ErrNotHeld) {
		if stop != nil {
			stop()
		}
		t.Errorf("WatchLoss of a grant the driver does not hold: %v, want ErrNotHeld", err)
	}
	stopped := grant("losswatch-stopped")
	stoppedReports, stopIt := watch(stopped)
	select {
	case err := <-reports:
		t.Fatalf("loss reported while the grant is held: %v", err)
	case err := <-stoppedReports:
		t.Fatalf("loss reported while the grant is held: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	stopIt()
	breakKey(stopped.Key)
	breakKey(g.Key)
	select {
	case err := <-reports:
		if !errors.Is(err, fenced.ErrLost) {
			t.Fatalf("after a break the watch reported %v, want an error matching ErrLost", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("backend implements LossWatcher, but a break by another client was not reported within 20s")
	}
	select {
	case err := <-reports:
		t.Fatalf("a second report of the same loss: %v", err)
	case err := <-stoppedReports:
		t.Fatalf("a watch reported a loss after its stop returned: %v", err)
	case <-time.After(time.Second):
	}
}

// testLongWait checks that a waiter whose wait outlasts its own TTL still
// gets a lease with (almost) its whole TTL of validity: validity is measured
// from the request that confirmed the grant, not from the start of the
// wait. The grant follows the holder's release, so its validity left is at
// least the TTL less the time since the release began, less a request's
// time (100 ms), and half the TTL where that is less. A machine so busy that
// the grant came back half a TTL after the release cannot tell; the round
// is then run again, up to three times.
func (s *suite) testLongWait(t *testing.T) {
	ctx := s.context(t)
	a := s.h.Client(t, nil)
	b := s.h.Client(t, &fenced.Options{MinBackoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	ttl := s.h.ShortTTL
	for round := 1; ; round++ {
		key := Key("longwait")
		la, err := a.TryAcquire(ctx, key, &fenced.LeaseOptions{TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		released := make(chan time.Time, 1)
		time.AfterFunc(2*ttl, func() {
			released <- time.Now()
			la.Release(context.Background())
		})
		// The holder releases after 2 TTLs: the wait covers that and 30s.
		lb, err := b.Acquire(ctx, key, &fenced.LeaseOptions{TTL: ttl, MaxWait: 2*ttl + 30*time.Second, ManualRenew: true})
		if err != nil {
			t.Fatalf("waiter: %v", err)
		}
		left, since := lb.Remaining(), time.Since(<-released)
		err = lb.Err()
		lb.Release(ctx)
		if since > ttl/2 && round < 3 {
			t.Logf("round %d: granted %v after the release began, half the TTL %v: the machine is too busy to tell; again",
				round, since, ttl)
			continue
		}
		if err != nil {
			t.Fatalf("a lease granted after waiting 2 TTLs (%v after the release) ended at once: %v", since, err)
		}
		if want := min(ttl/2, ttl-since-100*time.Millisecond); left < want {
			t.Fatalf("a lease granted after waiting 2 TTLs, %v after the release, has %v of validity left, want %v of its TTL %v",
				since, left, want, ttl)
		}
		return
	}
}

// testBatchRenew checks, for drivers implementing driver.BatchRenewer, that
// one batch renews exactly the grants that are current, each for its own
// TTL, and refuses the others one by one, without touching them.
func (s *suite) testBatchRenew(t *testing.T) {
	d, clk := s.expiryDriver(t)
	br := capability.Of(d).BatchRenewer
	if br == nil {
		skipUndeclared(t, "BatchRenew (driver.BatchRenewer)", "leases are renewed one request each")
	}
	ctx := Context(t)
	// TTLs in units of a minute, or less where the driver's longest TTL is
	// under three minutes (ZooKeeper's session bound).
	unit := time.Minute
	if longest := capability.Of(d).Declared.Keeps.MaxTTL; longest > 0 && longest < 3*unit {
		unit = (longest / 3).Truncate(time.Second)
	}
	prefix := Key("batch") + ":"
	var grants []driver.Grant
	for _, g := range []struct {
		key string
		ttl time.Duration
	}{{"a", 2 * unit}, {"b", unit}, {"c", unit}, {"d", 3 * unit}} {
		o := owner()
		f, err := d.TryAcquire(ctx, prefix+g.key, o, g.ttl)
		if err != nil {
			t.Fatal(err)
		}
		grants = append(grants, driver.Grant{Key: prefix + g.key, Owner: o, Fence: f, TTL: g.ttl})
	}
	if err := d.Release(ctx, grants[1]); err != nil {
		t.Fatal(err)
	}
	other := owner()
	fb, err := d.TryAcquire(ctx, grants[1].Key, other, unit)
	if err != nil {
		t.Fatal(err)
	}
	wrongFence := grants[2]
	wrongFence.Fence++
	batch := []driver.Grant{
		grants[0],
		grants[1], // released, now someone else's
		wrongFence,
		grants[3],
		{Key: prefix + "never", Owner: owner(), Fence: 1, TTL: unit},
	}
	// The grants already have their whole TTLs: let time pass (on the
	// fake clock when there is one) so that only a real renewal restores
	// them (checked below).
	const wait, slack = 3 * time.Second, 2 * time.Second
	if clk != nil {
		clk.Advance(wait)
	} else {
		time.Sleep(wait)
	}
	errs, err := br.RenewBatch(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	if len(errs) != len(batch) {
		t.Fatalf("RenewBatch returned %d results for %d grants", len(errs), len(batch))
	}
	for i, want := range []bool{true, false, false, true, false} {
		if want && errs[i] != nil {
			t.Errorf("grant %d (%v): %v, want renewed", i, batch[i], errs[i])
		}
		if !want && !errors.Is(errs[i], fenced.ErrNotHeld) {
			t.Errorf("grant %d (%v): %v, want ErrNotHeld", i, batch[i], errs[i])
		}
	}
	for _, c := range []struct {
		key   string
		fence uint64
		min   time.Duration
	}{
		{grants[0].Key, grants[0].Fence, 2*unit - slack},
		{grants[1].Key, fb, 0},
		{grants[2].Key, grants[2].Fence, 0},
		{grants[3].Key, grants[3].Fence, 3*unit - slack},
	} {
		info, err := d.Inspect(ctx, c.key)
		if err != nil {
			t.Fatal(err)
		}
		if !info.Held || info.Fence != c.fence || info.Remaining < c.min {
			t.Errorf("after the batch, %s = %+v; want held with fence %d and at least %v left", c.key, info, c.fence, c.min)
		}
	}
	if info, err := d.Inspect(ctx, prefix+"never"); !errors.Is(err, fenced.ErrNotFound) {
		t.Errorf("a batch renewal created %q: %+v, %v", prefix+"never", info, err)
	}
	if _, err := br.RenewBatch(ctx, nil); err != nil {
		t.Errorf("empty batch: %v", err)
	}
}
