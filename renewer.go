package fenced

import (
	"context"
	"sync"
	"time"

	"github.com/fenced-dev/fenced/driver"
)

// renewer renews every auto-renewed lease of one client. It wakes at the
// earliest due renewal and renews, together, every lease whose renewal falls
// within half a period of it. Leases renewed together stay together, so a
// client holding many leases converges to few batches, and a driver that
// implements driver.BatchRenewer renews each batch in one round trip.
type renewer struct {
	c *Client

	// ctx bounds every renewal request; stop cancels it, since the leases
	// are ended (their contexts cancelled) before the renewer stops.
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex
	leases  map[*Lease]struct{}
	started bool
	stopped bool
	kick    chan struct{}
	done    chan struct{}
	wg      sync.WaitGroup
}

func newRenewer(c *Client) *renewer {
	r := &renewer{c: c, leases: map[*Lease]struct{}{}, kick: make(chan struct{}, 1), done: make(chan struct{})}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	return r
}

// add schedules l for renewal, unless the renewer has stopped or l has
// already ended (Close can end a lease between its grant and this call).
func (r *renewer) add(l *Lease) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		return
	}
	l.mu.Lock()
	ended := l.ended
	l.mu.Unlock()
	if ended {
		return
	}
	r.leases[l] = struct{}{}
	if !r.started {
		r.started = true
		r.wg.Add(1)
		go r.loop()
	}
	r.wake()
}

func (r *renewer) remove(l *Lease) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.leases, l)
}

func (r *renewer) wake() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// stop stops scheduling renewals and cancels those in flight. It returns
// at once, with a channel closed when the renewer's goroutines are gone
// (which a driver that ignores its context can delay).
func (r *renewer) stop() <-chan struct{} {
	r.mu.Lock()
	if !r.stopped {
		r.stopped = true
		close(r.done)
		r.cancel()
	}
	r.mu.Unlock()
	gone := make(chan struct{})
	go func() {
		r.wg.Wait()
		close(gone)
	}()
	return gone
}

func (r *renewer) loop() {
	defer r.wg.Done()
	for {
		select {
		case <-r.done:
			return
		default:
		}
		batch, next := r.due()
		if len(batch) > 0 {
			r.wg.Add(1)
			go func() {
				defer r.wg.Done()
				r.renewBatch(batch)
				r.wake()
			}()
			continue
		}
		var timerC <-chan time.Time
		var t interface{ Stop() bool }
		if !next.IsZero() {
			tm := r.c.clock.NewTimer(next.Sub(r.c.clock.Now()))
			timerC, t = tm.C(), tm
		}
		select {
		case <-timerC:
		case <-r.kick:
		case <-r.done:
			if t != nil {
				t.Stop()
			}
			return
		}
		if t != nil {
			t.Stop()
		}
	}
}

// due returns the leases to renew now, marked as renewing, or else the time
// of the next renewal (zero when none is scheduled).
func (r *renewer) due() (batch []*Lease, next time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.c.clock.Now()
	var earliest time.Time
	for l := range r.leases {
		l.mu.Lock()
		if !l.renewing && (earliest.IsZero() || l.nextRenew.Before(earliest)) {
			earliest = l.nextRenew
		}
		l.mu.Unlock()
	}
	if earliest.IsZero() || earliest.After(now) {
		return nil, earliest
	}
	for l := range r.leases {
		l.mu.Lock()
		if !l.renewing && !l.nextRenew.After(now.Add(l.spec.RenewEvery/2)) {
			if l.spec.MaxHold != HoldForever && now.Add(l.spec.TTL).After(l.acquired.Add(l.spec.MaxHold)) {
				// Renewing would extend the lease past MaxHold: stop here and
				// let it expire.
				l.maxHoldHit = true
				delete(r.leases, l)
			} else {
				l.renewing = true
				batch = append(batch, l)
			}
		}
		l.mu.Unlock()
	}
	return batch, time.Time{}
}

func (r *renewer) renewBatch(batch []*Lease) {
	now := r.c.clock.Now()
	deadline := time.Time{}
	for _, l := range batch {
		if v := l.ValidUntil(); deadline.IsZero() || v.Before(deadline) {
			deadline = v
		}
	}
	// A renewal confirmed after local validity ran out is useless, so the
	// request may take at most that long (but at least a little).
	ctx, cancel := context.WithTimeout(r.ctx, max(deadline.Sub(now), 50*time.Millisecond))
	defer cancel()
	sent := r.c.clock.Now()
	if br, ok := r.c.drv.(driver.BatchRenewer); ok && len(batch) > 1 {
		grants := make([]driver.Grant, len(batch))
		for i, l := range batch {
			grants[i] = l.grant()
		}
		errs, err := br.RenewBatch(ctx, grants)
		for i, l := range batch {
			e := err
			if e == nil {
				e = errs[i]
			}
			l.applyRenew(sent, e)
		}
		return
	}
	var wg sync.WaitGroup
	for _, l := range batch {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.applyRenew(sent, r.c.drv.Renew(ctx, l.grant()))
		}()
	}
	wg.Wait()
}
