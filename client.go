package fenced

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
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
	// epoch is c's clock when c was made. Leases keep their moments as
	// durations since it (see since), which are smaller than time.Time
	// values and keep the monotonic reading of a real clock.
	epoch time.Time

	renew *renewer

	// closing is cancelled when Close begins: waits end, and a grant that
	// arrives afterwards is released instead of handed out.
	closing      context.Context
	beginClosing context.CancelFunc
	// halt is cancelled when Close stops waiting for the store (after
	// Options.CloseTimeout) or has finished: requests still in flight are
	// abandoned then.
	halt       context.Context
	cancelHalt context.CancelCauseFunc
	closeDone  chan struct{} // closed when the first Close returns

	mu        sync.Mutex
	closed    bool
	inflight  sync.WaitGroup                     // acquisitions admitted before Close began
	acquiring map[uint64]context.CancelCauseFunc // their requests' contexts, by admission
	admitted  uint64                             // admissions so far, the keys of acquiring
	wakeups   map[string]chan struct{}           // local release signals, per waited-for key
	waiting   map[string]int                     // waiters per key; wakeups entries live while > 0

	// releases counts releases through c, and waiters the entries of
	// waiting, so that a release need not take mu when nobody waits, and
	// a waiter can tell whether a release happened before it registered.
	releases atomic.Uint64
	waiters  atomic.Int64
}

// NewClient returns a Client over drv, for backends opened with their typed
// constructors. opts may be nil. The Client owns drv and closes it on Close.
// Options.Defaults are not checked here: a lease is checked, defaults
// included, when it is acquired (or by Resolve).
func NewClient(drv driver.Driver, opts *Options) *Client {
	c := &Client{drv: drv, acquiring: map[uint64]context.CancelCauseFunc{}, wakeups: map[string]chan struct{}{}, waiting: map[string]int{}, closeDone: make(chan struct{})}
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
	if c.opts.CloseTimeout <= 0 {
		c.opts.CloseTimeout = DefaultCloseTimeout
	}
	c.clock = c.opts.Clock
	c.epoch = c.clock.Now()
	c.hooks = c.opts.Hooks
	c.closing, c.beginClosing = context.WithCancel(context.Background())
	c.halt, c.cancelHalt = context.WithCancelCause(context.Background())
	c.renew = newRenewer(c)
	return c
}

// since returns t as a duration since c.epoch: c's timeline, on which
// leases keep their moments.
func (c *Client) since(t time.Time) time.Duration { return t.Sub(c.epoch) }

// at returns the moment d of c's timeline as a time.
func (c *Client) at(d time.Duration) time.Time { return c.epoch.Add(d) }

// now returns c's clock now, on c's timeline.
func (c *Client) now() time.Duration { return c.since(c.clock.Now()) }

// Driver returns the driver under c, for guards and tools that need a
// backend's own client.
func (c *Client) Driver() driver.Driver { return c.drv }

// Hooks returns the hooks c reports to, for guards that report stale writes.
func (c *Client) Hooks() Hooks { return c.hooks }

// Guarantees returns what the backend promises.
func (c *Client) Guarantees() Guarantees { return driver.GuaranteesOf(c.drv) }

// Close ends every lease still held through c and closes the driver. Later
// calls on c return ErrClosed; a second Close waits for the first and
// returns nil.
//
// In order: new acquisitions are refused and waiters give up with
// ErrClosed; every lease's context is cancelled with ErrClosed, before any
// key is freed, so no work under a lease's context is live once another
// client can hold its key; then the leases are released at the authority,
// in parallel. A grant that completes while Close runs is released, never
// handed out (its Acquire returns ErrClosed).
//
// Close waits for the store at most Options.CloseTimeout (real time,
// default DefaultCloseTimeout), plus the driver's own Close once no request
// is in flight. If the store has not answered by then (a hung authority),
// Close returns an error matching ErrUnknownOutcome: every lease's context
// is cancelled all the same, grants whose release was not confirmed expire
// at the authority within their TTL, and the driver is closed in the
// background once its requests return.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		<-c.closeDone
		return nil
	}
	c.closed = true
	c.beginClosing()
	c.mu.Unlock()
	// No lease joins the schedule once closed is set (see register).
	held := c.renew.held()
	defer close(c.closeDone)
	bound := time.AfterFunc(c.opts.CloseTimeout, c.haltRequests)
	defer bound.Stop()

	// Cancel every lease's context first, then free the keys.
	var ended []*Lease
	for _, l := range held {
		if l.end(ErrClosed) {
			ended = append(ended, l)
		}
	}
	renewerDone := c.renew.stop()
	settled := make(chan struct{})
	go func() {
		inParallel(min(len(ended), maxReleasers), len(ended), func(i int) { _ = ended[i].free(c.halt) })
		c.inflight.Wait() // acquisitions release what they were granted
		<-renewerDone
		close(settled)
	}()
	select {
	case <-settled:
	case <-c.halt.Done():
		select {
		case <-settled:
		default:
			go func() {
				<-settled
				_ = c.drv.Close()
			}()
			return fmt.Errorf("fenced: close: %w: the store did not answer within %v (Options.CloseTimeout); every lease's context is cancelled, grants whose release was not confirmed expire at the authority within their TTL, and the driver closes once its requests return",
				ErrUnknownOutcome, c.opts.CloseTimeout)
		}
	}
	c.haltRequests()
	return c.drv.Close()
}

// maxReleasers bounds the releases Close sends at once.
const maxReleasers = 64

// haltRequests abandons every request still in flight: Close has stopped
// waiting for the store, or is over.
func (c *Client) haltRequests() {
	c.cancelHalt(ErrClosed)
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cancel := range c.acquiring {
		cancel(ErrClosed)
	}
}

// admit registers an acquisition with c, so that Close waits for it, or
// reports ErrClosed once Close has begun. It returns the context for the
// acquisition's requests to the store: ctx, also cancelled when Close stops
// waiting for the store. The caller passes the returned id and cancel to
// finish when the acquisition is over.
//
// A ctx that can never be cancelled (context.Background and the like) needs
// no context of its own: its requests run under c.halt, with ctx's values.
func (c *Client) admit(ctx context.Context) (dctx context.Context, id uint64, cancel context.CancelCauseFunc, err error) {
	if _, hasDeadline := ctx.Deadline(); ctx.Done() == nil && !hasDeadline {
		dctx = haltable{Context: c.halt, values: ctx}
	} else {
		dctx, cancel = context.WithCancelCause(ctx)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		if cancel != nil {
			cancel(nil)
		}
		return nil, 0, nil, ErrClosed
	}
	c.inflight.Add(1)
	if cancel != nil {
		c.admitted++
		id = c.admitted
		c.acquiring[id] = cancel
	}
	return dctx, id, cancel, nil
}

// finish ends an acquisition that admit admitted.
func (c *Client) finish(id uint64, cancel context.CancelCauseFunc) {
	if cancel != nil {
		c.mu.Lock()
		delete(c.acquiring, id)
		c.mu.Unlock()
		cancel(nil)
	}
	c.inflight.Done()
}

// haltable is c.halt (done, with cause ErrClosed, when Close stops waiting
// for the store) with the values of a context that is never done.
type haltable struct {
	context.Context
	values context.Context
}

// Value implements context.Context: values' values, and c.halt's for the
// keys values has nothing for (c.halt has none of its own, but
// context.Cause finds its cause this way).
func (h haltable) Value(key any) any {
	if v := h.values.Value(key); v != nil {
		return v
	}
	return h.Context.Value(key)
}

// register puts l on c's schedule, which Close ends, unless Close has
// begun.
func (c *Client) register(l *Lease) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	c.renew.add(l)
	return true
}

// releaseOrphan releases a grant that arrived after Close began and
// returns the error its acquisition reports.
func (c *Client) releaseOrphan(g driver.Grant) error {
	if err := c.drv.Release(c.halt, g); err != nil {
		return fmt.Errorf("%w: the client was closed as the grant (fence %d) arrived, and releasing it failed (it expires at the authority within its TTL): %v", ErrClosed, g.Fence, err)
	}
	return fmt.Errorf("%w: the client was closed as the grant (fence %d) arrived; it was released", ErrClosed, g.Fence)
}

// TryAcquire acquires a lease on key without waiting: if the key is held it
// returns an error matching ErrHeld at once. opts may be nil; its MaxWait
// (and the client's default wait) is checked but not used.
func (c *Client) TryAcquire(ctx context.Context, key string, opts *LeaseOptions) (*Lease, error) {
	return c.acquire(ctx, key, opts, true)
}

// Acquire acquires a lease on key, waiting while it is held for up to
// MaxWait (see LeaseOptions: NoWait, the default, not at all; WaitForever
// until ctx ends). Waiting uses the backend's notifications or native queue
// when it has them and polls with exponential backoff and full jitter
// otherwise. opts may be nil; Resolve describes how it combines with the
// client's defaults.
//
// The returned lease outlives ctx: cancelling ctx stops the wait, not the
// lease. End the lease with Release. When the wait runs out the error
// matches ErrHeld; when ctx ends it matches ctx.Err(). A backend whose
// fence is weaker than MinFence fails with ErrNoFence. When the authority
// is unreachable the error matches ErrUnavailable, unless the lease may
// FailOpen. Once Close has begun the error matches ErrClosed.
func (c *Client) Acquire(ctx context.Context, key string, opts *LeaseOptions) (*Lease, error) {
	return c.acquire(ctx, key, opts, false)
}

func (c *Client) acquire(ctx context.Context, key string, opts *LeaseOptions, try bool) (*Lease, error) {
	// The clock is read for the hook only: reading it is not free on
	// every machine.
	var began time.Time
	if c.hooks.Acquired != nil {
		began = c.clock.Now()
	}
	ev := AcquireEvent{Key: key, Context: ctx}
	l, err := c.acquireChecked(ctx, key, opts, try, &ev)
	if c.hooks.Acquired != nil {
		ev.Waited = c.clock.Now().Sub(began)
	}
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

func (c *Client) acquireChecked(ctx context.Context, key string, opts *LeaseOptions, try bool, ev *AcquireEvent) (*Lease, error) {
	if err := ValidateKey(key); err != nil {
		return nil, err
	}
	spec, err := c.Resolve(opts)
	if err != nil {
		return nil, err
	}
	if try {
		spec.MaxWait = NoWait
	}
	ev.MaxWait = spec.MaxWait
	dctx, id, cancel, err := c.admit(ctx)
	if err != nil {
		return nil, err
	}
	defer c.finish(id, cancel)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return c.acquireLoop(ctx, dctx, key, spec, ev)
}

// acquireLoop acquires key. ctx is the caller's; dctx is ctx bounded by
// Close (see admit), for requests to the store.
func (c *Client) acquireLoop(ctx, dctx context.Context, key string, s LeaseSpec, ev *AcquireEvent) (_ *Lease, err error) {
	owner := newOwner()
	// unresolved is set while a request may have granted the key to owner
	// without saying so (see mayHaveGranted): an acquisition that gives up
	// then releases that grant (abandon), which nobody would otherwise
	// hold.
	unresolved := false
	defer func() {
		if err != nil && unresolved {
			c.abandon(ctx, key, owner, s.TTL)
		}
	}()
	var began time.Time // when the first request was sent
	wait := s.MaxWait != NoWait
	var (
		waitTimer clock.Timer
		waitOver  <-chan time.Time
	)
	// startWaitTimer starts the MaxWait timer, measured from began, the
	// first time it is needed: an acquisition granted at once has none.
	startWaitTimer := func() {
		if waitTimer == nil && wait && s.MaxWait != WaitForever {
			waitTimer = c.clock.NewTimer(s.MaxWait - c.clock.Now().Sub(began))
			waitOver = waitTimer.C()
		}
	}
	defer func() {
		if waitTimer != nil {
			waitTimer.Stop()
		}
	}()
	if q := c.ops().Queuer; q != nil && wait {
		began = c.clock.Now()
		startWaitTimer()
		l, err := c.acquireQueued(ctx, dctx, q, key, owner, s, waitOver, ev)
		// The driver ends its wait when ctx ends (or MaxWait runs out:
		// ErrHeld), but a grant may have crossed that.
		unresolved = err != nil && (errors.Is(err, ErrHeld) || !refused(err))
		return l, err
	}

	// A waiter registers for local release signals only once the key is
	// found held; releases counts what it could have missed before that.
	waiting := false
	defer func() {
		if waiting {
			c.stopWaiting(key)
		}
	}()
	notifier := c.ops().Notifier
	var (
		sub driver.Subscription
		// owed is set while a wake-up taken from sub has not been acted
		// on: no look at the store since showed the key held again (or
		// granted it). A waiter that leaves owing one forwards it, so a
		// backend that wakes one waiter per release strands nobody.
		owed    bool
		granted bool
	)
	defer func() {
		if sub == nil {
			return
		}
		if owed && !granted {
			if f, ok := sub.(driver.WakeForwarder); ok {
				f.Forward()
			}
		}
		sub.Close()
	}()
	var lastErr error
	for attempt := 1; ; attempt++ {
		var wake <-chan struct{}
		registered := false // as a waiter, after this attempt's request
		releasesBefore := uint64(0)
		if waiting {
			wake = c.wakeup(key)
		} else {
			releasesBefore = c.releases.Load()
		}
		ev.Attempts = attempt
		c.hooks.attempt(AttemptEvent{Key: key, Attempt: attempt, Context: ctx})
		sent := c.clock.Now()
		if attempt == 1 {
			began = sent
		}
		fence, err := c.tryAcquire(dctx, key, owner, s)
		if err == nil {
			granted, unresolved = true, false
			return c.newLease(ctx, key, owner, fence, sent, s)
		}
		if mayHaveGranted(dctx, err) {
			unresolved = true
		} else if errors.Is(err, ErrHeld) {
			unresolved = false // owner would have been given its own grant back
		}
		var sleep time.Duration
		switch {
		case errors.Is(err, ErrHeld):
			ev.Contended = true
			owed = false // the holder's release will wake a waiter
			if !wait {
				return nil, err
			}
			if !waiting {
				// Register for local release signals (see the check
				// before the sleep below).
				wake = c.startWaiting(key)
				waiting, registered = true, true
			}
			if notifier != nil && sub == nil {
				// Subscribe, then try again at once: a release between the
				// failed try and the subscription must not be missed.
				if ns, serr := notifier.Subscribe(dctx, key); serr == nil {
					sub = ns
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
			if errors.Is(err, ErrUnavailable) && s.FailOpen {
				return c.failOpenLease(ctx, key, owner, sent, s)
			}
			if !wait && attempt > 1 {
				return nil, err
			}
			sleep = c.backoff(attempt - 1)
			if !wait {
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
		if registered && c.releases.Load() != releasesBefore {
			// A release through c may have come between this attempt's
			// request and the registration, and no channel saw it (see
			// signalRelease): try again at once.
			continue
		}
		startWaitTimer()
		t := c.clock.NewTimer(sleep)
		select {
		case <-t.C():
		case <-subC:
			owed = true
		case <-wake:
		case <-waitOver:
			t.Stop()
			return nil, fmt.Errorf("gave up after waiting %v: %w", s.MaxWait, lastErr)
		case <-ctx.Done():
			t.Stop()
			return nil, context.Cause(ctx)
		case <-c.closing.Done():
			t.Stop()
			return nil, ErrClosed
		}
		t.Stop()
	}
}

// tryAcquire makes one grant request, with the lease's terms for drivers
// that take them.
func (c *Client) tryAcquire(ctx context.Context, key, owner string, s LeaseSpec) (uint64, error) {
	if ta := c.ops().TermsAcquirer; ta != nil {
		return ta.TryAcquireTerms(ctx, key, owner, s.terms())
	}
	return c.drv.TryAcquire(ctx, key, owner, s.TTL)
}

// acquireQueued waits in the backend's native queue. ctx is the caller's;
// dctx is ctx bounded by Close (see untilHalt).
func (c *Client) acquireQueued(ctx, dctx context.Context, q driver.TimedQueuer, key, owner string, s LeaseSpec, waitOver <-chan time.Time, ev *AcquireEvent) (*Lease, error) {
	qctx, cancel := context.WithCancelCause(dctx)
	defer cancel(nil)
	// Close ends the wait at once; the queue leaves nothing behind.
	defer context.AfterFunc(c.closing, func() { cancel(ErrClosed) })()
	errWaitOver := fmt.Errorf("gave up after waiting %v: %w", s.MaxWait, ErrHeld)
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
	// Validity starts when the grant was confirmed, not when the wait
	// began. The driver reports that on the real clock; carry the offset
	// over to c's clock.
	realStart := time.Now()
	fence, confirmed, err := q.AcquireTimed(qctx, key, owner, s.TTL)
	if err == nil && confirmed.After(realStart) {
		sent = sent.Add(confirmed.Sub(realStart))
	}
	if err != nil {
		switch cause := context.Cause(qctx); {
		case cause == errWaitOver:
			ev.Contended = true
			return nil, errWaitOver
		case ctx.Err() != nil:
			return nil, context.Cause(ctx)
		case errors.Is(cause, ErrClosed):
			return nil, ErrClosed
		}
		if errors.Is(err, ErrUnavailable) && s.FailOpen {
			return c.failOpenLease(ctx, key, owner, sent, s)
		}
		return nil, err
	}
	return c.newLease(ctx, key, owner, fence, sent, s)
}

// startWaiting registers a waiter for key and returns the channel of the
// next local release of key (see wakeup).
func (c *Client) startWaiting(key string) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.waiting[key]++
	c.waiters.Add(1)
	return c.wakeupLocked(key)
}

func (c *Client) stopWaiting(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.waiters.Add(-1)
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
	return c.wakeupLocked(key)
}

func (c *Client) wakeupLocked(key string) <-chan struct{} {
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

// signalRelease wakes the local waiters of key after a release. It counts
// the release first and looks for waiters after, while a waiter registers
// first and looks at the count after, so at least one of them sees the
// other: either the waiter tries again at once, or its channel is closed.
func (c *Client) signalRelease(key string) {
	c.releases.Add(1)
	if c.waiters.Load() == 0 {
		return
	}
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
		return shortOwner(info), fmt.Errorf("fenced: inspect %q: %w", key, err)
	}
	return shortOwner(info), nil
}

// shortOwner makes sure that no owner token leaves the admin API whole,
// whatever the driver reported: drivers shorten owners already
// (LeaseInfo.SetOwner), and ShortOwner leaves a shortened owner as it is.
func shortOwner(info LeaseInfo) LeaseInfo {
	info.Owner = driver.ShortOwner(info.Owner)
	return info
}

// List returns the held leases whose keys start with prefix ("" for all),
// sorted by key.
func (c *Client) List(ctx context.Context, prefix string) ([]LeaseInfo, error) {
	infos, err := c.drv.List(ctx, prefix)
	if err != nil {
		return nil, fmt.Errorf("fenced: list %q: %w", prefix, err)
	}
	for i := range infos {
		infos[i] = shortOwner(infos[i])
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
		return shortOwner(info), fmt.Errorf("fenced: break %q: %w", key, err)
	}
	return shortOwner(info), nil
}

// Breaks returns the recorded breaks of key ("" for every key), oldest
// first. Backends without an audit log return ErrUnsupported.
func (c *Client) Breaks(ctx context.Context, key string) ([]BreakRecord, error) {
	bl := c.ops().BreakLogger
	if bl == nil {
		return nil, fmt.Errorf("fenced: breaks: %w", ErrUnsupported)
	}
	recs, err := bl.Breaks(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("fenced: breaks %q: %w", key, err)
	}
	for i := range recs {
		recs[i].Owner = driver.ShortOwner(recs[i].Owner)
	}
	return recs, nil
}
