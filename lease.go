package fenced

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fenced-dev/fenced/clock"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/core/token"
)

// Lease is one grant of a key. Its methods are safe for concurrent use.
//
// A lease is valid until the first of: Release; the authority saying it
// is no longer ours (renewal refused, session lost, broken by an admin);
// or its local validity running out.
//
// Local validity runs on the client's clock (Options.Clock). By default
// that is clock.Real, which on Linux counts time spent suspended. It starts
// when the acquire (or last successful renew) request was sent. It is the
// TTL minus SafetyMargin, so it never outlasts the authority's view.
//
// Err, Remaining and Healthy read that clock when called. Right after a
// resume from a suspend they already say the lease is over. Its context is
// cancelled by the client's schedule, whose timer may wake up to
// clock.MaxTimerStep after the resume. The context's cause matches
// ErrLost, ErrExpired, ErrReleased or ErrClosed. After Release or Close it
// is cancelled before the key is freed at the authority.
//
// Checking the lease before a write is not enough: the process can pause
// between the check and the write. Send Fence with every write and let the
// resource refuse stale ones (package fence).
type Lease struct {
	c          *Client
	key, owner string
	fence      uint64
	spec       LeaseOptions
	acquired   time.Duration // when the acquire request was sent, on c's timeline (see Client.since)
	failedOpen bool

	ctx    context.Context
	cancel context.CancelCauseFunc

	// Guarded by c.renew.mu: the lease's place in its client's schedule.
	wake    time.Duration // when the schedule looks at the lease next; never later than its next event
	heapIdx int           // index in the schedule's heap, -1 when not in it

	mu         sync.Mutex
	validUntil time.Duration // end of local validity, on c's timeline
	nextRenew  time.Duration // when automatic renewal is next due, on c's timeline
	renewing   bool
	maxHoldHit bool
	ended      bool
	released   bool // Release or Close has taken the lease over
	freed      bool // the release at the authority is over
	lastErr    error
	releaseErr error         // the release's outcome, set with freed
	freedCh    chan struct{} // made by a second Release that waits, closed with freed
	// The driver's loss watch (see lossWatchDelay): the timer that starts
	// it, then the function that stops it; nil without one.
	lossWatch     *time.Timer
	stopLossWatch func()
}

// makeLease returns the lease of a grant whose request was sent at sent (on
// c's clock). Local validity is measured from sent.
func (c *Client) makeLease(parent context.Context, key, owner string, fence uint64, sent time.Time, s LeaseOptions) *Lease {
	at := c.since(sent)
	l := &Lease{
		c: c, key: key, owner: owner, fence: fence, spec: s, acquired: at,
		heapIdx:    -1,
		validUntil: at + s.validity(),
		nextRenew:  at + s.RenewEvery,
	}
	l.ctx, l.cancel = context.WithCancelCause(withoutCancel(parent))
	return l
}

// withoutCancel returns parent without its cancellation, as
// context.WithoutCancel does, or parent itself when it has none to drop.
func withoutCancel(parent context.Context) context.Context {
	if _, hasDeadline := parent.Deadline(); parent.Done() == nil && !hasDeadline {
		return parent
	}
	return context.WithoutCancel(parent)
}

// newLease hands out a grant, or releases it and returns ErrClosed if Close
// began while it was being granted. The lease joins its client's schedule,
// which ends it when its local validity runs out and renews it if it
// renews automatically: no goroutine or timer of its own.
func (c *Client) newLease(parent context.Context, key, owner string, fence uint64, sent time.Time, s LeaseOptions) (*Lease, error) {
	l := c.makeLease(parent, key, owner, fence, sent, s)
	if !c.register(l) {
		l.cancel(ErrClosed)
		return nil, c.releaseOrphan(l.grant())
	}
	if w := c.ops().LossWatcher; w != nil {
		t := time.AfterFunc(lossWatchDelay, func() { l.watchLoss(w) })
		l.mu.Lock()
		l.lossWatch = t
		l.mu.Unlock()
	}
	return l, nil
}

// lossWatchDelay is how long after its grant a lease starts its driver's
// loss watch (driver.LossWatcher). A short hold (most locks) ends before
// then and costs neither the authority a watch nor the client a goroutine:
// only a runtime timer, stopped when the lease ends. The watch's first look
// still sees a loss that happened meanwhile (each driver's watch starts
// from the grant), and until then renewal and the local validity deadline
// guard the lease as they always do.
const lossWatchDelay = 100 * time.Millisecond

// watchLoss starts w's loss watch of l (on the goroutine of l's lossWatch
// timer): a loss it reports ends l, and the watch stops when l ends.
func (l *Lease) watchLoss(w driver.LossWatcher) {
	if l.ctx.Err() != nil {
		return
	}
	// The driver's report must not block: the lease ends on a goroutine
	// of its own (which also runs the Lost hook).
	stop, err := w.WatchLoss(l.grant(), func(err error) { go l.loseWatched(err) })
	if err != nil {
		return // not held any more: the next renewal finds out
	}
	l.mu.Lock()
	l.lossWatch = nil
	if l.ended {
		l.mu.Unlock()
		l.c.renew.cleanup.do(stop)
		return
	}
	l.stopLossWatch = stop
	l.mu.Unlock()
}

// takeLossWatch returns what ends l's loss watch: the timer that would
// start it, or the watch's stop function (either may be nil). l.mu must be
// held; the caller calls endLossWatch after unlocking it.
func (l *Lease) takeLossWatch() (*time.Timer, func()) {
	t, stop := l.lossWatch, l.stopLossWatch
	l.lossWatch, l.stopLossWatch = nil, nil
	return t, stop
}

// endLossWatch stops what takeLossWatch returned. It is called after the
// lease's context is cancelled, and it never waits for the driver: the
// driver's stop runs on the client's cleanup workers (see cleaner), since
// it may block (on etcd, a Send on a stream whose peer stopped reading)
// and the caller may be the schedule, which must go on ending the other
// leases at their validity.
func (l *Lease) endLossWatch(t *time.Timer, stop func()) {
	if t != nil {
		t.Stop()
	}
	if stop != nil {
		l.c.renew.cleanup.do(stop)
	}
}

func (c *Client) failOpenLease(parent context.Context, key, owner string, sent time.Time, s LeaseOptions) (*Lease, error) {
	s.ManualRenew, s.RenewEvery = true, 0
	l := c.makeLease(parent, key, owner, 0, sent, s)
	l.failedOpen = true
	if !c.register(l) {
		l.cancel(ErrClosed)
		return nil, ErrClosed
	}
	return l, nil
}

// grant is l's grant as drivers see it, with the TTL it is renewed for.
func (l *Lease) grant() driver.Grant {
	return driver.Grant{Key: l.key, Owner: l.owner, Fence: l.fence, TTL: l.spec.TTL}
}

// Key returns the leased key.
func (l *Lease) Key() string { return l.key }

// Fence returns the fencing token of this grant: strictly greater than the
// fence of every earlier grant of the key (within the backend's declared
// FenceStrength). It is zero for backends without a fence and for leases
// that failed open.
func (l *Lease) Fence() uint64 { return l.fence }

// Owner returns the owner token (128 random bits, hex). It proves
// ownership: pass it to guards that record it, never log it in full.
func (l *Lease) Owner() string { return l.owner }

// FailedOpen reports whether this lease was granted locally because the
// authority was unavailable and its options allowed FailOpen (with MinFence
// FenceNone). Such a lease excludes nobody, has fence zero and is not
// renewed.
func (l *Lease) FailedOpen() bool { return l.failedOpen }

// Options returns the options the lease was granted with, as
// Client.Resolve filled them in. A lease that failed open reports
// ManualRenew.
func (l *Lease) Options() LeaseOptions { return l.spec }

// Context returns a context that is cancelled, with a cause, when the lease
// ends. Run the protected work under it.
func (l *Lease) Context() context.Context { return l.ctx }

// Err returns nil while the lease is held. Afterwards it says why the
// lease ended: an error matching ErrLost, ErrExpired, ErrReleased or
// ErrClosed. It reads the client's clock. So it ends a lease whose
// validity has run out even before the schedule does (Go's timers are late
// after a resume from a suspend).
func (l *Lease) Err() error {
	if l.ctx.Err() == nil {
		l.mu.Lock()
		ended, over := l.ended, l.c.now() >= l.validUntil
		l.mu.Unlock()
		switch {
		case !ended && !over:
			return nil
		case !ended:
			if e, ok := l.expire(true); ok {
				e.finish()
			}
		}
		// Ended elsewhere (an expiry, a loss, a release) whose cancel has
		// not run yet: the lease is not held, and its cause comes next.
		<-l.ctx.Done()
	}
	return context.Cause(l.ctx)
}

// validUntilTime returns the local deadline after which the lease must not
// be trusted. It is comparable with time.Now (clock.Local). It moves
// earlier by the time the machine spends suspended. Remaining is the
// public question; the conformance suite and the proof read this one
// through rootaccess.
func (l *Lease) validUntilTime() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return clock.Local(l.c.clock, l.c.at(l.validUntil))
}

// Remaining returns how much local validity is left; zero once the lease
// has ended.
func (l *Lease) Remaining() time.Duration {
	if l.ctx.Err() != nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return max(0, l.validUntil-l.c.now())
}

// Healthy reports whether the lease is held and its last renewal (if any)
// succeeded. After a failed renewal the holder should start no new
// protected work, even though the lease stays valid until its local
// validity ends or the authority says otherwise.
func (l *Lease) Healthy() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.ended && l.lastErr == nil && l.c.now() < l.validUntil
}

// String describes the lease without revealing the owner token.
func (l *Lease) String() string { return l.grant().String() }

// Renew extends the lease by its TTL from now. Only leases with
// ManualRenew need it. If the authority no longer has this grant, it
// returns an error matching ErrNotHeld, and the lease ends with ErrLost.
// If the lease has already ended, it returns the end cause.
func (l *Lease) Renew(ctx context.Context) error {
	if err := l.Err(); err != nil {
		return fmt.Errorf("fenced: renew %q: %w", l.key, err)
	}
	if l.failedOpen {
		return fmt.Errorf("fenced: renew %q: lease failed open: %w", l.key, ErrUnavailable)
	}
	sent := l.c.now()
	err := l.c.drv.Renew(ctx, l.grant())
	if l.applyRenew(sent, sent, err) {
		l.c.renew.reschedule(l)
	}
	if err != nil {
		return fmt.Errorf("fenced: renew %q: %w", l.key, err)
	}
	return nil
}

// Release ends the lease. It first cancels the lease's context with
// ErrReleased, unless the lease has already ended with another cause. So no
// work under it is live once another client can get the key. Then it ends
// the grant at the authority, which keeps the key's fence counter.
//
// It never removes another owner's grant. If the grant was lost or
// replaced, it returns an error matching ErrNotHeld. A second call, or a
// call after Close, waits for the first release and returns its result. It
// returns ctx's error if ctx ends first.
func (l *Lease) Release(ctx context.Context) error {
	if !l.end(ErrReleased) {
		l.mu.Lock()
		if l.freed {
			defer l.mu.Unlock()
			return l.releaseErr
		}
		if l.freedCh == nil {
			l.freedCh = make(chan struct{})
		}
		freed := l.freedCh
		l.mu.Unlock()
		select {
		case <-freed:
			l.mu.Lock()
			defer l.mu.Unlock()
			return l.releaseErr
		case <-ctx.Done():
			return fmt.Errorf("fenced: release %q: %w", l.key, context.Cause(ctx))
		}
	}
	return l.free(ctx)
}

// end ends the lease locally: it takes the lease off its client's
// schedule (no more renewal) and cancels its context with cause (which
// keeps an earlier cause if the lease was already lost). It reports false,
// doing nothing, if Release or Close already took the lease over. The
// caller then frees the grant.
func (l *Lease) end(cause error) bool {
	l.mu.Lock()
	if l.released {
		l.mu.Unlock()
		return false
	}
	l.released = true
	l.ended = true
	t, stop := l.takeLossWatch()
	l.mu.Unlock()
	l.c.renew.remove(l)
	l.cancel(cause)
	l.endLossWatch(t, stop)
	return true
}

// free releases the grant at the authority, once, after end.
func (l *Lease) free(ctx context.Context) error {
	var err error
	if !l.failedOpen {
		err = l.c.drv.Release(ctx, l.grant())
	}
	l.c.signalRelease(l.key)
	if err != nil {
		err = fmt.Errorf("fenced: release %q: %w", l.key, err)
	}
	if l.c.opts.Hook != nil {
		l.c.emit(Event{Kind: EventRelease, Key: l.key, Fence: l.fence, Lease: l, Err: err, Duration: l.c.now() - l.acquired})
	}
	l.mu.Lock()
	l.freed, l.releaseErr = true, err
	if l.freedCh != nil {
		close(l.freedCh)
	}
	l.mu.Unlock()
	return err
}

// loseWatched ends the lease for a loss its watch reported. Seen once
// the local validity has run out, the loss is an expiry: the store ended
// a grant the client had given up, and only its schedule ran late (on a
// busy machine the watch's report can come first).
func (l *Lease) loseWatched(cause error) {
	l.mu.Lock()
	over := l.c.now() >= l.validUntil
	l.mu.Unlock()
	if over {
		if e, ok := l.expire(true); ok {
			e.finish()
		}
		return
	}
	l.lose(cause)
}

// lose ends the lease with cause unless it has already ended.
func (l *Lease) lose(cause error) {
	if e, ok := l.endLost(cause, true); ok {
		e.finish()
	}
}

// endLost is the first half of lose: it ends l locally and cancels its
// context with cause, unless l has already ended (ok false). scheduled
// says whether l may still be on its client's schedule; the schedule's own
// loop, which has taken the leases it ends off its heap, passes false and
// so ends a great many leases at once without taking the schedule's lock
// for each. The caller calls finish on the result.
func (l *Lease) endLost(cause error, scheduled bool) (e lossEnd, ok bool) {
	l.mu.Lock()
	if l.ended {
		l.mu.Unlock()
		return lossEnd{}, false
	}
	l.ended = true
	t, stop := l.takeLossWatch()
	l.mu.Unlock()
	if scheduled {
		l.c.renew.remove(l)
	}
	l.cancel(cause)
	return lossEnd{l: l, t: t, stop: stop, cause: cause}, true
}

// lossEnd is what remains to do after a lost lease's context is
// cancelled: stop its loss watch (on the cleanup workers) and call the
// Lost hook.
type lossEnd struct {
	l     *Lease
	t     *time.Timer
	stop  func()
	cause error
}

func (e lossEnd) finish() {
	l := e.l
	l.endLossWatch(e.t, e.stop)
	l.c.emit(Event{Kind: EventLost, Key: l.key, Fence: l.fence, Lease: l, Err: e.cause, Duration: l.c.now() - l.acquired})
}

// applyRenew records the outcome of a renewal request sent at sent (on
// c's timeline), as part of a batch that began at began (sent, for a
// renewal of its own). Local validity runs from sent; the next automatic
// renewal is due a period after began, so that the leases of a batch,
// whose requests leave over some time, stay due together. A refused
// renewal loses the lease. Otherwise it reports true, and the caller hands
// the lease back to the schedule (renewer.reschedule), whose look at it
// the outcome has moved.
func (l *Lease) applyRenew(began, sent time.Duration, err error) bool {
	l.c.emit(Event{Kind: EventRenew, Key: l.key, Fence: l.fence, Lease: l, Err: err})
	if err != nil && errors.Is(err, ErrNotHeld) {
		l.mu.Lock()
		ended := l.ended
		l.mu.Unlock()
		if !ended { // else no cause to look up (a release raced the renewal)
			l.lose(l.refusedCause(err))
		}
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.renewing = false
	if err != nil {
		l.lastErr = err
		// Try again soon, but not in a tight loop: a fraction of what
		// validity is left.
		now := l.c.now()
		left := l.validUntil - now
		l.nextRenew = now + max(min(l.spec.RenewEvery/4, left/3), time.Millisecond)
		return true
	}
	l.lastErr = nil
	l.validUntil = max(l.validUntil, sent+l.spec.validity())
	// At least half a period after this request, though, should the batch
	// have taken that long.
	l.nextRenew = max(began+l.spec.RenewEvery, sent+l.spec.RenewEvery/2)
	return true
}

// nextEvent returns when the schedule must look at l next: the end of its
// local validity, or its next automatic renewal if that comes first and
// none is in flight. l.mu must be held.
func (l *Lease) nextEvent() time.Duration {
	next := l.validUntil
	if l.renewsNext() && l.nextRenew < next {
		next = l.nextRenew
	}
	return next
}

// renewsNext reports whether automatic renewal will send l's next renewal.
// l.mu must be held.
func (l *Lease) renewsNext() bool {
	return !l.spec.ManualRenew && !l.renewing && !l.maxHoldHit && !l.ended
}

// expire ends l because its local validity ran out, saying why no renewal
// kept it; see endLost.
func (l *Lease) expire(scheduled bool) (lossEnd, bool) {
	l.mu.Lock()
	e := &expiry{lastErr: l.lastErr, maxHold: l.maxHoldHit, l: l}
	l.mu.Unlock()
	return l.endLost(e, scheduled)
}

// breakLookupTimeout bounds the audit-log read that tells a broken lease
// from one whose renewal was refused for another reason. It runs once per
// lost lease, after the loss is certain, so it delays only the report.
const breakLookupTimeout = time.Second

// refusedCause is the cause of a lease whose renewal the authority refused
// with err: a break recorded for this grant in the store's audit log when
// there is one, a plain refusal otherwise.
func (l *Lease) refusedCause(err error) error {
	if rec, ok := l.recordedBreak(); ok {
		return fmt.Errorf("%w: %w (%s, at %s): %s", ErrLost, ErrBroken, rec.By, rec.Time.UTC().Format(time.RFC3339), rec.Reason)
	}
	return fmt.Errorf("%w: the authority refused renewal: %v", ErrLost, err)
}

// recordedBreak looks in the store's break log for a break of l's grant.
func (l *Lease) recordedBreak() (driver.BreakRecord, bool) {
	bl := l.c.ops().BreakLogger
	if bl == nil {
		return driver.BreakRecord{}, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), breakLookupTimeout)
	defer cancel()
	recs, err := bl.Breaks(ctx, l.key)
	if err != nil {
		return driver.BreakRecord{}, false
	}
	short := token.Short(l.owner)
	for i := len(recs) - 1; i >= 0; i-- {
		if r := recs[i]; r.Fence == l.fence && r.Owner == short {
			return r, true
		}
	}
	return driver.BreakRecord{}, false
}

// HoldAtLeast waits until the lease's MinHold has passed since granted,
// the time its holder learnt of the grant. It returns sooner when the
// lease ends or ctx is done. It does not release the lease. Adapters that
// release a lease themselves (a scheduler's Unlock) call it first. Do
// calls it after its work.
func (l *Lease) HoldAtLeast(ctx context.Context, granted time.Time) {
	left := l.spec.MinHold - time.Since(granted)
	if left <= 0 {
		return
	}
	t := time.NewTimer(left)
	defer t.Stop()
	select {
	case <-t.C:
	case <-l.ctx.Done():
	case <-ctx.Done():
	}
}

// SetValue publishes value with l's grant for readers of Client.Value, as
// an election's leader proclaims itself. The value lives as long as the
// grant. It fails with an error matching ErrNotHeld when the store no
// longer has the grant (l is not ended by it: Renew asks again), and with
// ErrUnsupported on stores without a value slot.
func (l *Lease) SetValue(ctx context.Context, value string) error {
	v := l.c.ops().Valuer
	if v == nil {
		return fmt.Errorf("fenced: set value of %q: %w: the store has no value slot", l.key, ErrUnsupported)
	}
	if err := v.SetValue(ctx, l.grant(), value); err != nil {
		return fmt.Errorf("fenced: set value of %q: %w", l.key, err)
	}
	return nil
}
