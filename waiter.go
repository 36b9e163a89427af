package fenced

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fenced-dev/fenced/clock"
	"github.com/fenced-dev/fenced/driver"
)

// waiter is one acquisition of a key: the state its tries share (see
// acquireLoop). Its methods are the steps of one try.
type waiter struct {
	c     *Client
	ctx   context.Context // the caller's
	dctx  context.Context // ctx bounded by Close, for the store
	key   string
	s     LeaseOptions
	ev    *Event
	owner string
	// unresolved is set while a request may have granted the key to owner
	// without saying so (see mayHaveGranted). Nobody would hold that
	// grant, so an acquisition that gives up releases it (abandon).
	unresolved bool
	began      time.Time // when the first request was sent
	wait       bool      // MaxWait is not zero
	waitTimer  clock.Timer
	waitOver   <-chan time.Time
	// A waiter registers for local release signals once the key is found
	// held (waiting). releasesBefore counts what it could miss before.
	waiting  bool
	notifier driver.Notifier // nil once subscribing failed: poll
	sub      driver.Subscription
	// owed is set while a wake-up taken from sub was not acted on. No look
	// at the store since showed the key held again, or granted it. A
	// waiter that leaves owing one forwards it. So a backend that wakes
	// one waiter per release strands nobody.
	owed    bool
	granted bool
	lastErr error
	// over is set once MaxWait ran out while a last try was due: that try
	// is the last.
	over bool

	// The current try.
	attempt        int
	sent           time.Time // when its request was sent
	wake           <-chan struct{}
	registered     bool // as a waiter, after this try's request
	releasesBefore uint64
	pause          time.Duration // the sleep before the next try
}

// act is what a step of a waiter decided.
type act int

const (
	actProceed act = iota // go on with this try
	actRetry              // make the next try at once
	actReturn             // return the step's lease and error
)

// startWaitTimer starts the MaxWait timer, measured from began, the first
// time it is needed: an acquisition granted at once has none.
func (w *waiter) startWaitTimer() {
	if w.waitTimer == nil && w.wait && w.s.MaxWait != WaitForever {
		w.waitTimer = clock.NewTimerAt(w.c.clock, w.began.Add(w.s.MaxWait))
		w.waitOver = w.waitTimer.C()
	}
}

// stopWaitTimer stops the MaxWait timer if it was started.
func (w *waiter) stopWaitTimer() {
	if w.waitTimer != nil {
		w.waitTimer.Stop()
	}
}

// queued waits in the backend's native queue.
func (w *waiter) queued(q driver.TimedQueuer) (*Lease, error) {
	w.began = w.c.clock.Now()
	w.startWaitTimer()
	l, err := w.queue(q)
	// The driver ends its wait when ctx ends (or MaxWait runs out:
	// ErrHeld), but a grant may have crossed that.
	w.unresolved = err != nil && (errors.Is(err, ErrHeld) || !refused(err))
	return l, err
}

// queue waits in the backend's native queue q. Close ends the wait at
// once; the queue leaves nothing behind.
func (w *waiter) queue(q driver.TimedQueuer) (*Lease, error) {
	qctx, cancel := context.WithCancelCause(w.dctx)
	defer cancel(nil)
	defer context.AfterFunc(w.c.closing, func() { cancel(ErrClosed) })()
	errWaitOver := fmt.Errorf("gave up after waiting %v: %w", w.s.MaxWait, ErrHeld)
	if waitOver := w.waitOver; waitOver != nil {
		go func() {
			select {
			case <-waitOver:
				cancel(errWaitOver)
			case <-qctx.Done():
			}
		}()
	}
	fence, err := w.queueTimed(qctx, q)
	if err != nil {
		var final bool
		if fence, final, err = w.queueEnded(qctx, errWaitOver, err); final {
			return nil, err
		}
	}
	if err != nil {
		if errors.Is(err, ErrUnavailable) && w.s.FailOpen {
			return w.c.failOpenLease(w.ctx, w.key, w.owner, w.sent, w.s)
		}
		return nil, err
	}
	return w.confirmInTime(qctx, fence)
}

// queueTimed makes the queued requests, and sets sent to when the grant
// was confirmed.
func (w *waiter) queueTimed(qctx context.Context, q driver.TimedQueuer) (uint64, error) {
	w.ev.Attempt = 1
	w.c.emit(Event{Kind: EventAttempt, Key: w.key, Attempt: 1, Context: w.ctx})
	w.sent = w.c.clock.Now()
	// Validity starts when the grant was confirmed, not when the wait
	// began. The driver reports that on the real clock; carry the offset
	// over to c's clock.
	realStart := time.Now()
	fence, confirmed, err := q.AcquireTimed(qctx, w.key, w.owner, w.s.TTL)
	// A wait may lose its place when the store cannot be reached: its
	// session expired while this process was stopped, or a connection
	// broke. Nothing was granted then. It queues again after a backoff,
	// as the polling wait asks again, until the wait ends.
	for attempt := 2; err != nil && errors.Is(err, ErrUnavailable) && !w.s.FailOpen && qctx.Err() == nil; attempt++ {
		t := w.c.clock.NewTimer(w.c.backoff(attempt - 1))
		select {
		case <-t.C():
		case <-qctx.Done():
		}
		t.Stop()
		if qctx.Err() != nil {
			break
		}
		w.ev.Attempt = attempt
		w.c.emit(Event{Kind: EventAttempt, Key: w.key, Attempt: attempt, Context: w.ctx})
		w.sent, realStart = w.c.clock.Now(), time.Now()
		fence, confirmed, err = q.AcquireTimed(qctx, w.key, w.owner, w.s.TTL)
	}
	if err == nil && confirmed.After(realStart) {
		w.sent = w.sent.Add(confirmed.Sub(realStart))
	}
	return fence, err
}

// queueEnded handles a queued wait that failed with err. When final is
// set, the error it returns is returned as it is.
func (w *waiter) queueEnded(qctx context.Context, errWaitOver, err error) (fence uint64, final bool, _ error) {
	switch cause := context.Cause(qctx); {
	case cause == errWaitOver:
		// The queue left nothing behind. One last try, as the
		// polling wait makes: this process may have been stopped
		// past MaxWait while the key became free.
		w.ev.Contended = true
		if w.ctx.Err() != nil || w.c.closing.Err() != nil {
			return 0, true, errWaitOver
		}
		w.ev.Attempt++
		w.c.emit(Event{Kind: EventAttempt, Key: w.key, Attempt: w.ev.Attempt, Context: w.ctx})
		w.sent = w.c.clock.Now()
		if fence, err = w.c.tryAcquire(w.dctx, w.key, w.owner, w.s); errors.Is(err, ErrHeld) {
			return 0, true, errWaitOver
		}
		return fence, false, err
	case w.ctx.Err() != nil:
		return 0, true, ctxEnded(w.ctx)
	case errors.Is(cause, ErrClosed):
		return 0, true, ErrClosed
	}
	return 0, false, err
}

// confirmInTime returns the lease of a grant with fence. A grant
// confirmed past its local validity (this process was stopped after the
// confirmation) is asked for again as the same owner. That returns it
// with a fresh expiry and the same fence. It asks until an answer comes
// in time, or once more after MaxWait ran out.
func (w *waiter) confirmInTime(qctx context.Context, fence uint64) (*Lease, error) {
	last := false
	for w.c.grantedTooLate(w.sent, w.s) {
		if last || w.ctx.Err() != nil || w.c.closing.Err() != nil {
			took := w.c.clock.Now().Sub(w.sent).Round(time.Millisecond)
			return nil, fmt.Errorf("%w: granted %v after the request, past its validity of %v", ErrExpired, took, w.s.validity())
		}
		// A stop that made the answer late may also have outlasted
		// MaxWait. One last ask then, as the polling wait makes.
		last = w.c.waitEnded(qctx, w.waitOver)
		w.sent = w.c.clock.Now()
		var err error
		if fence, err = w.c.tryAcquire(w.dctx, w.key, w.owner, w.s); err != nil {
			return nil, fmt.Errorf("granted past its validity, then not again: %w", err)
		}
	}
	return w.c.newLease(w.ctx, w.key, w.owner, fence, w.sent, w.s)
}

// poll asks the store until it grants the key or the wait ends.
func (w *waiter) poll() (*Lease, error) {
	w.notifier = w.c.ops().Notifier
	for w.attempt = 1; ; w.attempt++ {
		fence, err := w.try()
		if err == nil && w.c.grantedTooLate(w.sent, w.s) {
			if err := w.tooLate(); err != nil {
				return nil, err
			}
			continue
		}
		if err == nil {
			w.granted, w.unresolved = true, false
			return w.c.newLease(w.ctx, w.key, w.owner, fence, w.sent, w.s)
		}
		switch a, l, ferr := w.failed(err); a {
		case actReturn:
			return l, ferr
		case actRetry:
			continue
		}
		w.lastErr = err
		if w.over {
			return nil, fmt.Errorf("gave up after waiting %v: %w", w.s.MaxWait, w.lastErr)
		}
		if err := w.sleep(); err != nil {
			return nil, err
		}
	}
}

// try makes one grant request.
func (w *waiter) try() (uint64, error) {
	w.wake, w.registered, w.releasesBefore, w.pause = nil, false, 0, 0
	if w.waiting {
		w.wake = w.c.wakeup(w.key)
	} else {
		w.releasesBefore = w.c.releases.Load()
	}
	w.ev.Attempt = w.attempt
	w.c.emit(Event{Kind: EventAttempt, Key: w.key, Attempt: w.attempt, Context: w.ctx})
	w.sent = w.c.clock.Now()
	if w.attempt == 1 {
		w.began = w.sent
	}
	return w.c.tryAcquire(w.dctx, w.key, w.owner, w.s)
}

// tooLate handles a grant whose answer came after its local validity ran
// out. This process was stopped, or the authority answered late. Asking
// again as the same owner returns the same grant with a fresh expiry.
// Its validity is measured from the new request. A dead lease is never
// handed out. tooLate returns the error to give up with, or nil to try
// again.
func (w *waiter) tooLate() error {
	w.unresolved = true
	took := w.c.clock.Now().Sub(w.sent).Round(time.Millisecond)
	err := fmt.Errorf("%w: granted %v after the request, past its validity of %v", ErrExpired, took, w.s.validity())
	w.lastErr = err
	if (!w.wait && w.attempt > 1) || w.over || w.ctx.Err() != nil || w.c.closing.Err() != nil {
		return err
	}
	if w.c.waitEnded(w.ctx, w.waitOver) {
		// The stop that made the answer late outlasted MaxWait: one
		// last try as the same owner, as sleep makes.
		w.waitOver, w.over = nil, true
	}
	w.startWaitTimer()
	return nil
}

// failed handles a request that failed with err.
func (w *waiter) failed(err error) (act, *Lease, error) {
	if mayHaveGranted(w.dctx, err) {
		w.unresolved = true
	} else if errors.Is(err, ErrHeld) {
		w.unresolved = false // owner would have been given its own grant back
	}
	switch {
	case errors.Is(err, ErrHeld):
		a, herr := w.held(err)
		return a, nil, herr
	case errors.Is(err, ErrUnknownOutcome), errors.Is(err, ErrUnavailable):
		return w.unsure(err)
	}
	if w.ctx.Err() != nil {
		return actReturn, nil, ctxEnded(w.ctx)
	}
	return actReturn, nil, err
}

// held handles a key held by another owner: it registers as a waiter,
// subscribes, and sets the pause before the next try.
func (w *waiter) held(err error) (act, error) {
	w.ev.Contended = true
	w.owed = false // the holder's release will wake a waiter
	if !w.wait {
		return actReturn, err
	}
	if !w.waiting {
		// Register for local release signals (see the check in sleep).
		w.wake = w.c.startWaiting(w.key)
		w.waiting, w.registered = true, true
	}
	if w.notifier != nil && w.sub == nil {
		// Subscribe, then try again at once: a release between the
		// failed try and the subscription must not be missed.
		if ns, serr := w.notifier.Subscribe(w.dctx, w.key); serr == nil {
			w.sub = ns
			return actRetry, nil
		}
		w.notifier = nil // fall back to polling
	}
	var held *HeldError
	hint := time.Duration(0)
	if errors.As(err, &held) && held.Remaining > 0 {
		hint = held.Remaining + time.Millisecond
	}
	if w.sub != nil {
		w.pause = w.c.opts.FallbackPoll
	} else {
		w.pause = w.c.backoff(w.attempt - 1)
	}
	if hint > 0 {
		w.pause = min(w.pause, hint)
	}
	return actProceed, nil
}

// unsure handles an unknown outcome or an unreachable authority. The
// owner token makes a retried TryAcquire idempotent, so an unknown
// outcome is resolved by asking again.
func (w *waiter) unsure(err error) (act, *Lease, error) {
	if errors.Is(err, ErrUnavailable) && w.s.FailOpen {
		l, err := w.c.failOpenLease(w.ctx, w.key, w.owner, w.sent, w.s)
		return actReturn, l, err
	}
	if !w.wait && w.attempt > 1 {
		return actReturn, nil, err
	}
	w.pause = w.c.backoff(w.attempt - 1)
	if !w.wait {
		w.pause = 0
	}
	return actProceed, nil, nil
}

// sleep waits for the next try: the pause, a wake-up, or the end of
// MaxWait. It returns the error to give up with, or nil to try again.
func (w *waiter) sleep() error {
	var subC <-chan struct{}
	if w.sub != nil {
		subC = w.sub.C()
		// The backend's notification also covers releases through this
		// client. It may wake fewer waiters than a broadcast (one per
		// process for Redis). The local broadcast is not needed then: it
		// would only make every local waiter retry at once.
		w.wake = nil
	}
	if w.registered && w.c.releases.Load() != w.releasesBefore {
		// A release through c may have come between this try's request
		// and the registration. No channel saw it (see signalRelease), so
		// try again at once.
		return nil
	}
	w.startWaitTimer()
	t := w.c.clock.NewTimer(w.pause)
	select {
	case <-t.C():
	case <-subC:
		w.owed = true
	case <-w.wake:
	case <-w.waitOver:
		// One last try when the wait runs out. The last answer may be old:
		// this process was stopped, or its sleep was long. The key may
		// have been free for a while.
		t.Stop()
		w.waitOver, w.over = nil, true
		return nil
	case <-w.ctx.Done():
		t.Stop()
		return ctxEnded(w.ctx)
	case <-w.c.closing.Done():
		t.Stop()
		return ErrClosed
	}
	t.Stop()
	return nil
}

// leave ends the waiter's subscription, forwarding a wake-up it owes, and
// its registration for local release signals.
func (w *waiter) leave() {
	if w.sub != nil {
		if w.owed && !w.granted {
			if f, ok := w.sub.(driver.WakeForwarder); ok {
				f.Forward()
			}
		}
		w.sub.Close()
	}
	if w.waiting {
		w.c.stopWaiting(w.key)
	}
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
