// Package mem is the in-process reference backend of fenced.
//
// It keeps leases in memory, so it protects nothing across processes; it is
// the reference the conformance suite is written against, and a fast store
// for tests. Its clock is injectable, so tests drive expiry with a
// clock.Fake instead of sleeping.
//
// URL form: mem://NAME. Clients opened with the same NAME in one process
// share one store, so "reopening" keeps every fence counter, as a durable
// backend would. mem:// (no name) opens a fresh private store.
package mem

import (
	"context"
	"fmt"
	"net/url"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/clock"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/driver/wakeup"
	"github.com/fenced-dev/fenced/internal/backend/urlquery"
	"github.com/fenced-dev/fenced/internal/core/token"
	"github.com/fenced-dev/fenced/internal/core/ttlrule"
)

func init() {
	fenced.Register("mem", func(_ context.Context, u *url.URL) (driver.Driver, error) {
		if u.Opaque != "" || (u.Path != "" && u.Path != "/") {
			return nil, fmt.Errorf("%w: mem URL takes only a name: mem://NAME", fenced.ErrInvalidURL)
		}
		q, err := urlquery.Parse(u.RawQuery)
		if err == nil {
			err = q.NoRest()
		}
		if err != nil {
			return nil, fmt.Errorf("mem URL takes only a name (mem://NAME): %w", err)
		}
		if u.Host == "" {
			return New(nil), nil
		}
		return Named(u.Host), nil
	}, driver.Expiry{Name: "in-process memory", Note: "expiry to the nanosecond; the store dies with the process"})
}

var (
	namedMu sync.Mutex
	named   = map[string]*Store{}
)

// Named returns the process-wide store called name, creating it on first
// use with the real clock.
func Named(name string) *Driver {
	namedMu.Lock()
	defer namedMu.Unlock()
	s, ok := named[name]
	if !ok {
		s = NewStore(clock.Real())
		named[name] = s
	}
	return s.Driver()
}

// Store is the shared state behind one or more drivers.
type Store struct {
	clock clock.Clock

	mu      sync.Mutex
	keys    map[string]*entry
	breaks  []driver.BreakRecord
	wake    wakeup.Registry // waiters by key
	floor   uint64          // driver.FenceFloorer
	watches map[string][]*lossWatch
	queues  map[string][]*ticket // driver.TimedQueuer, head first
	// checkpoints by key (driver.Checkpointer): apart from keys, since a
	// checkpoint outlives its grant and a pruned key's record.
	checkpoints map[string]checkpoint
}

type entry struct {
	owner   string
	fence   uint64
	expires time.Time
	value   string    // the grant's value (driver.Valuer); reset by every grant
	ended   time.Time // when the last grant was released or broken
}

// NewStore returns an empty store whose expiry follows clk.
func NewStore(clk clock.Clock) *Store {
	if clk == nil {
		clk = clock.Real()
	}
	return &Store{clock: clk, keys: map[string]*entry{}}
}

// Driver returns a new driver over s. Closing it does not affect s.
func (s *Store) Driver() *Driver { return &Driver{s: s} }

// DriverWith returns a new driver over s with opts, whose Clock is ignored
// (s has its own).
func (s *Store) DriverWith(opts Options) *Driver { return &Driver{s: s, opts: opts} }

// Options configure New.
type Options struct {
	// Clock decides expiry. Default: the real clock.
	Clock clock.Clock
	// Queue makes waiters wait in the store's FIFO queue of each key
	// (driver.TimedQueuer, as on etcd and ZooKeeper) instead of being
	// woken through Subscribe.
	Queue bool
	// Terms and BatchRenew declare driver.TermsAcquirer and
	// driver.BatchRenewer. Like Queue, each stands in for a Driver method
	// (TryAcquire, Renew) that the portable layer then no longer calls, so
	// they are off by default: a test double that embeds a *Driver and
	// overrides TryAcquire or Renew would be bypassed.
	Terms, BatchRenew bool
	// MinTTL and MaxTTL, when not zero, narrow the TTLs the driver
	// declares it accepts (driver.Capabilities), as a backend with bounds
	// of its own does.
	MinTTL, MaxTTL time.Duration
}

// New returns a driver over a fresh private store. opts may be nil.
func New(opts *Options) *Driver {
	var o Options
	if opts != nil {
		o = *opts
	}
	return NewStore(o.Clock).DriverWith(o)
}

// Driver implements driver.Driver and every optional operation of
// driver.Capabilities.
type Driver struct {
	s    *Store
	opts Options

	mu     sync.Mutex
	closed bool
}

var (
	_ driver.Driver          = (*Driver)(nil)
	_ driver.Notifier        = (*Driver)(nil)
	_ driver.ObserveNotifier = (*Driver)(nil)
	_ driver.BreakLogger     = (*Driver)(nil)
	_ driver.Valuer          = (*Driver)(nil)
)

func (d *Driver) lock() (*Store, error) {
	d.mu.Lock()
	closed := d.closed
	d.mu.Unlock()
	if closed {
		return nil, fenced.ErrClosed
	}
	d.s.mu.Lock()
	return d.s, nil
}

// lockCtx is lock for a request, which ctx may have ended already.
func (d *Driver) lockCtx(ctx context.Context) (*Store, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return d.lock()
}

func (e *entry) heldAt(now time.Time) bool { return e.owner != "" && now.Before(e.expires) }

// held returns g's entry if g is its key's current, unexpired grant.
// The caller holds s.mu.
func (s *Store) held(g driver.Grant) (*entry, error) { return s.heldAt(g, s.clock.Now()) }

// heldAt returns g's entry if g is its key's current grant at now.
func (s *Store) heldAt(g driver.Grant, now time.Time) (*entry, error) {
	e := s.keys[g.Key]
	if e == nil || !e.heldAt(now) || e.owner != g.Owner || e.fence != g.Fence {
		return nil, fmt.Errorf("%s fence %d: %w", g.Key, g.Fence, fenced.ErrNotHeld)
	}
	return e, nil
}

// TryAcquire implements driver.Driver.
func (d *Driver) TryAcquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	s, err := d.lockCtx(ctx)
	if err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	return s.tryLocked(key, owner, ttl, s.clock.Now(), false)
}

// tryLocked is TryAcquire under the store's lock. A key with waiters in
// its queue goes to the head of the queue only (head set), so a try that
// is not the head's is refused while anyone queues.
func (s *Store) tryLocked(key, owner string, ttl time.Duration, now time.Time, head bool) (uint64, error) {
	e := s.keys[key]
	if e == nil {
		e = &entry{}
		s.keys[key] = e
	}
	if e.heldAt(now) {
		if e.owner != owner {
			return 0, &fenced.HeldError{Remaining: e.expires.Sub(now)}
		}
		e.expires = now.Add(ttl)
		return e.fence, nil
	}
	if !head && len(s.queues[key]) > 0 {
		return 0, &fenced.HeldError{}
	}
	return s.grant(key, e, owner, ttl, now), nil
}

// Renew implements driver.Driver.
func (d *Driver) Renew(ctx context.Context, g driver.Grant) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := ttlrule.Check(g); err != nil {
		return err
	}
	s, err := d.lock()
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	return s.renew(g, s.clock.Now())
}

// Release implements driver.Driver.
func (d *Driver) Release(ctx context.Context, g driver.Grant) error {
	s, err := d.lockCtx(ctx)
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	e := s.keys[g.Key]
	if e == nil || e.owner != g.Owner || e.fence != g.Fence {
		return fmt.Errorf("%s fence %d: %w", g.Key, g.Fence, fenced.ErrNotHeld)
	}
	s.end(g.Key, e, s.clock.Now(), nil)
	return nil
}

func (s *Store) info(key string, e *entry, now time.Time) driver.LeaseInfo {
	info := driver.LeaseInfo{Key: key, Fence: e.fence}
	if e.heldAt(now) {
		info.Held = true
		token.Set(&info, e.owner)
		info.Remaining = e.expires.Sub(now)
	}
	return info
}

// Inspect implements driver.Driver.
func (d *Driver) Inspect(ctx context.Context, key string) (driver.LeaseInfo, error) {
	s, err := d.lock()
	if err != nil {
		return driver.LeaseInfo{}, err
	}
	defer s.mu.Unlock()
	e := s.keys[key]
	if e == nil || e.fence == 0 {
		return driver.LeaseInfo{Key: key}, fenced.ErrNotFound
	}
	return s.info(key, e, s.clock.Now()), nil
}

// List implements driver.Driver.
func (d *Driver) List(ctx context.Context, prefix string) ([]driver.LeaseInfo, error) {
	s, err := d.lock()
	if err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	now := s.clock.Now()
	var out []driver.LeaseInfo
	for k, e := range s.keys {
		if strings.HasPrefix(k, prefix) && e.heldAt(now) {
			out = append(out, s.info(k, e, now))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// Break implements driver.Driver.
func (d *Driver) Break(ctx context.Context, key string, reason, by string) (driver.LeaseInfo, error) {
	s, err := d.lock()
	if err != nil {
		return driver.LeaseInfo{}, err
	}
	defer s.mu.Unlock()
	now := s.clock.Now()
	e := s.keys[key]
	if e == nil || !e.heldAt(now) {
		return driver.LeaseInfo{Key: key}, fmt.Errorf("%s: %w", key, fenced.ErrNotHeld)
	}
	info := s.info(key, e, now)
	s.breaks = append(s.breaks, driver.BreakRecord{
		Time: now, Key: key, Fence: e.fence, Owner: info.Owner, Reason: reason, By: by,
	})
	s.end(key, e, now, fmt.Errorf("%w: %s was broken by %q: %s", fenced.ErrLost, key, by, reason))
	return info, nil
}

// Breaks implements driver.BreakLogger.
func (d *Driver) Breaks(ctx context.Context, key string) ([]driver.BreakRecord, error) {
	s, err := d.lock()
	if err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	var out []driver.BreakRecord
	for _, b := range s.breaks {
		if key == "" || b.Key == key {
			out = append(out, b)
		}
	}
	return out, nil
}

// guarantees is what the backend promises, the part of Capabilities
// that says how far a lease can be trusted.
func (d *Driver) guarantees() driver.Capabilities {
	return driver.Capabilities{
		Fence:       fenced.FenceStrict,
		ServerClock: true,
		// The real clock's readings carry Go's monotonic clock.
		ClockStepSafe: true,
		Note: "in-process only: excludes nothing across processes; fences live as long as the process; " +
			"expiry on the Store's clock (the real one is monotonic)",
	}
}

// Close implements driver.Driver.
func (d *Driver) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	return nil
}

// Subscribe implements driver.Notifier. A release or break wakes the
// waiters of that key only; waiters of other keys are not disturbed.
func (d *Driver) Subscribe(ctx context.Context, key string) (driver.Subscription, error) {
	s, err := d.lock()
	if err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	return s.wake.Subscribe(key), nil
}

// SubscribeObserver implements driver.ObserveNotifier: an observer is
// woken by every release or break of key, and never counts as a waiter.
func (d *Driver) SubscribeObserver(ctx context.Context, key string) (driver.Subscription, error) {
	s, err := d.lock()
	if err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	return s.wake.Observe(key), nil
}

// notify wakes the waiters of key and the head of its queue.
func (s *Store) notify(key string) {
	s.wake.Wake(key)
	s.signalHead(key)
}

// SetValue implements driver.Valuer.
func (d *Driver) SetValue(ctx context.Context, g driver.Grant, value string) error {
	s, err := d.lockCtx(ctx)
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	e, err := s.held(g)
	if err != nil {
		return err
	}
	e.value = value
	return nil
}

// Value implements driver.Valuer.
func (d *Driver) Value(ctx context.Context, key string) (driver.LeaseInfo, string, error) {
	s, err := d.lock()
	if err != nil {
		return driver.LeaseInfo{}, "", err
	}
	defer s.mu.Unlock()
	e := s.keys[key]
	if e == nil || e.fence == 0 {
		return driver.LeaseInfo{Key: key}, "", fenced.ErrNotFound
	}
	info := s.info(key, e, s.clock.Now())
	if !info.Held {
		return info, "", nil
	}
	return info, e.value, nil
}
