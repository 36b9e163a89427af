package fenced

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fenced-dev/fenced/clock"
	"github.com/fenced-dev/fenced/driver"
)

// Client is the portable handle on a lease store. It is safe for concurrent
// use; open one per process and store and share it. Close it to release its
// leases and connections.
type Client struct {
	drv   driver.Driver
	opts  Options
	clock clock.Clock
	hooks Hooks

	renew *renewer

	mu      sync.Mutex
	closed  bool
	leases  map[*Lease]struct{}
	wakeups map[string]chan struct{} // local release signals, per waited-for key
	waiting map[string]int           // waiters per key; wakeups entries live while > 0
}

// NewClient returns a Client over drv, for backends opened with their typed
// constructors. opts may be nil. The Client owns drv and closes it on Close.
func NewClient(drv driver.Driver, opts *Options) *Client {
	c := &Client{drv: drv, leases: map[*Lease]struct{}{}, wakeups: map[string]chan struct{}{}, waiting: map[string]int{}}
	if opts != nil {
		c.opts = *opts
	}
	if c.opts.Clock == nil {
		c.opts.Clock = clock.Real()
	}
	if c.opts.MinBackoff <= 0 {
		c.opts.MinBackoff = 10 * time.Millisecond
	}
	if c.opts.MaxBackoff < c.opts.MinBackoff {
		c.opts.MaxBackoff = max(time.Second, c.opts.MinBackoff)
	}
	if c.opts.FallbackPoll <= 0 {
		c.opts.FallbackPoll = 2 * time.Second
	}
	c.clock = c.opts.Clock
	c.hooks = c.opts.Hooks
	c.renew = newRenewer(c)
	return c
}

// Driver returns the driver under c, for guards and tools that need a
// backend's own client.
func (c *Client) Driver() driver.Driver { return c.drv }

// Hooks returns the hooks c reports to, for guards that report stale writes.
func (c *Client) Hooks() Hooks { return c.hooks }

// Guarantees returns what the backend promises.
func (c *Client) Guarantees() Guarantees { return c.drv.Guarantees() }

// Close releases every lease still held through c (best effort, a few
// seconds at most), cancels their contexts with ErrClosed and closes the
// driver. Later calls on c return ErrClosed.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	held := make([]*Lease, 0, len(c.leases))
	for l := range c.leases {
		held = append(held, l)
	}
	c.mu.Unlock()
	c.renew.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	for _, l := range held {
		_ = l.release(ctx, ErrClosed)
	}
	return c.drv.Close()
}

func (c *Client) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// TryAcquire acquires a lease on key without waiting: if the key is held it
// returns an error matching ErrHeld at once. opts may be nil; its MaxWait is
// ignored.
func (c *Client) TryAcquire(ctx context.Context, key string, opts *LeaseOptions) (*Lease, error) {
	o := c.resolve(opts)
	if o.MaxWait < 0 && o.MaxWait != WaitForever {
		// Reject what Acquire would reject, although TryAcquire never waits.
		return c.acquire(ctx, key, o)
	}
	o.MaxWait = 0
	return c.acquire(ctx, key, o)
}

// Acquire acquires a lease on key, waiting while it is held for up to
// opts.MaxWait (zero: not at all; WaitForever: until ctx ends). Waiting uses
// the backend's notifications or native queue when it has them and polls
// with exponential backoff and full jitter otherwise. opts may be nil.
//
// The returned lease outlives ctx: cancelling ctx stops the wait, not the
// lease. End the lease with Release. When the wait runs out the error
// matches ErrHeld; when ctx ends it matches ctx.Err(). A correctness lease
// on a backend with a weaker fence than accepted fails with ErrNoFence.
// When the authority is unreachable the error matches ErrUnavailable,
// unless an efficiency lease asked to FailOpen.
func (c *Client) Acquire(ctx context.Context, key string, opts *LeaseOptions) (*Lease, error) {
	return c.acquire(ctx, key, c.resolve(opts))
}

func (c *Client) acquire(ctx context.Context, key string, o LeaseOptions) (*Lease, error) {
	began := c.clock.Now()
	ev := AcquireEvent{Key: key, MaxWait: o.MaxWait, Context: ctx}
	l, err := c.acquireLoop(ctx, key, o, &ev)
	ev.Waited = c.clock.Now().Sub(began)
	if err != nil {
		err = fmt.Errorf("fenced: acquire %q: %w", key, err)
		ev.Err = err
	} else {
		ev.Fence = l.fence
		ev.FailedOpen = l.failedOpen
		ev.Lease = l
	}
	c.hooks.acquired(ev)
	return l, err
}

func (c *Client) acquireLoop(ctx context.Context, key string, o LeaseOptions, ev *AcquireEvent) (*Lease, error) {
	if err := c.check(key, o); err != nil {
		return nil, err
	}
	if c.isClosed() {
		return nil, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	owner := newOwner()

	var waitOver <-chan time.Time
	if o.MaxWait > 0 {
		t := c.clock.NewTimer(o.MaxWait)
		defer t.Stop()
		waitOver = t.C()
	}
	if q, ok := c.drv.(driver.Queuer); ok && o.MaxWait != 0 {
		return c.acquireQueued(ctx, q, key, owner, o, waitOver, ev)
	}

	if o.MaxWait != 0 {
		c.startWaiting(key)
		defer c.stopWaiting(key)
	}
	notifier, _ := c.drv.(driver.Notifier)
	var sub driver.Subscription
	defer func() {
		if sub != nil {
			sub.Close()
		}
	}()
	var lastErr error
	for attempt := 1; ; attempt++ {
		wake := c.wakeup(key)
		ev.Attempts = attempt
		c.hooks.attempt(AttemptEvent{Key: key, Attempt: attempt, Context: ctx})
		sent := c.clock.Now()
		fence, err := c.drv.TryAcquire(ctx, key, owner, o.TTL)
		if err == nil {
			return c.newLease(ctx, key, owner, fence, sent, o), nil
		}
		var sleep time.Duration
		switch {
		case errors.Is(err, ErrHeld):
			ev.Contended = true
			if o.MaxWait == 0 {
				return nil, err
			}
			if notifier != nil && sub == nil {
				// Subscribe, then try again at once: a release between the
				// failed try and the subscription must not be missed.
				if s, serr := notifier.Subscribe(ctx, key); serr == nil {
					sub = s
					continue
				}
				notifier = nil // fall back to polling
			}
			var held *driver.HeldError
			hint := time.Duration(0)
			if errors.As(err, &held) && held.Remaining > 0 {
				hint = held.Remaining + time.Millisecond
			}
			if sub != nil {
				sleep = c.opts.FallbackPoll
				if hint > 0 {
					sleep = min(sleep, hint)
				}
			} else {
				sleep = c.backoff(attempt - 1)
				if hint > 0 {
					sleep = min(sleep, hint)
				}
			}
		case errors.Is(err, ErrUnknownOutcome), errors.Is(err, ErrUnavailable):
			// The owner token makes a retried TryAcquire idempotent, so an
			// unknown outcome is resolved by asking again.
			if errors.Is(err, ErrUnavailable) && o.FailOpen && o.Purpose == Efficiency {
				return c.failOpenLease(ctx, key, owner, sent, o), nil
			}
			if o.MaxWait == 0 && attempt > 1 {
				return nil, err
			}
			sleep = c.backoff(attempt - 1)
			if o.MaxWait == 0 {
				sleep = 0
			}
		default:
			return nil, err
		}
		lastErr = err
		var subC <-chan struct{}
		if sub != nil {
			subC = sub.C()
			// The backend's notification also covers releases through this
			// client, and may wake fewer waiters than a broadcast would
			// (one per process for Redis), so the local broadcast is not
			// needed and would only make every local waiter retry at once.
			wake = nil
		}
		t := c.clock.NewTimer(sleep)
		select {
		case <-t.C():
		case <-subC:
		case <-wake:
		case <-waitOver:
			t.Stop()
			return nil, fmt.Errorf("gave up after waiting %v: %w", o.MaxWait, lastErr)
		case <-ctx.Done():
			t.Stop()
			return nil, context.Cause(ctx)
		}
		t.Stop()
	}
}

func (c *Client) acquireQueued(ctx context.Context, q driver.Queuer, key, owner string, o LeaseOptions, waitOver <-chan time.Time, ev *AcquireEvent) (*Lease, error) {
	qctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	errWaitOver := fmt.Errorf("gave up after waiting %v: %w", o.MaxWait, ErrHeld)
	if waitOver != nil {
		go func() {
			select {
			case <-waitOver:
				cancel(errWaitOver)
			case <-qctx.Done():
			}
		}()
	}
	ev.Attempts = 1
	c.hooks.attempt(AttemptEvent{Key: key, Attempt: 1, Context: ctx})
	sent := c.clock.Now()
	var (
		fence uint64
		err   error
	)
	if tq, ok := q.(driver.TimedQueuer); ok {
		// Validity starts when the grant was confirmed, not when the wait
		// began. The driver reports that on the real clock; carry the
		// offset over to c's clock.
		realStart := time.Now()
		var confirmed time.Time
		fence, confirmed, err = tq.AcquireTimed(qctx, key, owner, o.TTL)
		if err == nil && confirmed.After(realStart) {
			sent = sent.Add(confirmed.Sub(realStart))
		}
	} else {
		fence, err = q.Acquire(qctx, key, owner, o.TTL)
	}
	if err != nil {
		if cause := context.Cause(qctx); cause == errWaitOver {
			ev.Contended = true
			return nil, errWaitOver
		}
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		if errors.Is(err, ErrUnavailable) && o.FailOpen && o.Purpose == Efficiency {
			return c.failOpenLease(ctx, key, owner, sent, o), nil
		}
		return nil, err
	}
	return c.newLease(ctx, key, owner, fence, sent, o), nil
}

func (c *Client) startWaiting(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.waiting[key]++
}

func (c *Client) stopWaiting(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.waiting[key]--; c.waiting[key] <= 0 {
		delete(c.waiting, key)
		delete(c.wakeups, key)
	}
}

// wakeup returns a channel closed when a lease on key is next released
// through this client, so local waiters need not wait for a poll. It
// returns nil (never ready) for keys nobody waits on, so the map holds only
// keys with waiters.
func (c *Client) wakeup(key string) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.waiting[key] == 0 {
		return nil
	}
	ch, ok := c.wakeups[key]
	if !ok {
		ch = make(chan struct{})
		c.wakeups[key] = ch
	}
	return ch
}

func (c *Client) signalRelease(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ch, ok := c.wakeups[key]; ok {
		close(ch)
		delete(c.wakeups, key)
	}
}

// newOwner returns 128 random bits, hex encoded.
func newOwner() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("fenced: crypto/rand failed: " + err.Error())
	}
	return hex.EncodeToString(b[:])
}

// Inspect describes key as the authority sees it. The owner is shortened.
// A key never granted returns an error matching ErrNotFound.
func (c *Client) Inspect(ctx context.Context, key string) (LeaseInfo, error) {
	if err := ValidateKey(key); err != nil {
		return LeaseInfo{}, fmt.Errorf("fenced: inspect: %w", err)
	}
	info, err := c.drv.Inspect(ctx, key)
	if err != nil {
		return info, fmt.Errorf("fenced: inspect %q: %w", key, err)
	}
	return info, nil
}

// List returns the held leases whose keys start with prefix ("" for all),
// sorted by key.
func (c *Client) List(ctx context.Context, prefix string) ([]LeaseInfo, error) {
	infos, err := c.drv.List(ctx, prefix)
	if err != nil {
		return nil, fmt.Errorf("fenced: list %q: %w", prefix, err)
	}
	return infos, nil
}

// Break ends the current grant of key whoever holds it: the holder's next
// renewal fails (its lease context is cancelled with ErrLost) and the next
// grant gets a higher fence. reason is required; by names who broke it.
// Backends that keep an audit log record the break (see Breaks). It returns
// what was broken, or an error matching ErrNotHeld when nothing was held.
func (c *Client) Break(ctx context.Context, key, reason, by string) (LeaseInfo, error) {
	if err := ValidateKey(key); err != nil {
		return LeaseInfo{}, fmt.Errorf("fenced: break: %w", err)
	}
	if reason == "" {
		return LeaseInfo{}, fmt.Errorf("fenced: break %q: a reason is required", key)
	}
	info, err := c.drv.Break(ctx, key, driver.BreakRequest{Reason: reason, By: by})
	if err != nil {
		return info, fmt.Errorf("fenced: break %q: %w", key, err)
	}
	return info, nil
}

// Breaks returns the recorded breaks of key ("" for every key), oldest
// first. Backends without an audit log return ErrUnsupported.
func (c *Client) Breaks(ctx context.Context, key string) ([]BreakRecord, error) {
	bl, ok := c.drv.(driver.BreakLogger)
	if !ok {
		return nil, fmt.Errorf("fenced: breaks: %w", ErrUnsupported)
	}
	recs, err := bl.Breaks(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("fenced: breaks %q: %w", key, err)
	}
	return recs, nil
}
