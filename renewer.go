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

	mu      sync.Mutex
	leases  map[*Lease]struct{}
	started bool
	stopped bool
	kick    chan struct{}
	done    chan struct{}
	wg      sync.WaitGroup
}

func newRenewer(c *Client) *renewer {
	return &renewer{c: c, leases: map[*Lease]struct{}{}, kick: make(chan struct{}, 1), done: make(chan struct{})}
}

func (r *renewer) add(l *Lease) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
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

func (r *renewer) stop() {
	r.mu.Lock()
	if r.stopped {
		r.mu.Unlock()
		return
	}
	r.stopped = true
	close(r.done)
	r.mu.Unlock()
	r.wg.Wait()
}

func (r *renewer) loop() {
	defer r.wg.Done()
	for {
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
		if !l.renewing && !l.nextRenew.After(now.Add(l.opts.RenewEvery/2)) {
			if l.opts.MaxHold > 0 && now.Add(l.opts.TTL).After(l.acquired.Add(l.opts.MaxHold)) {
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
	ctx, cancel := context.WithTimeout(context.Background(), max(deadline.Sub(now), 50*time.Millisecond))
	defer cancel()
	sent := r.c.clock.Now()
	if br, ok := r.c.drv.(driver.BatchRenewer); ok && len(batch) > 1 {
		reqs := make([]driver.RenewRequest, len(batch))
		for i, l := range batch {
			reqs[i] = driver.RenewRequest{Grant: l.grant(), TTL: l.opts.TTL}
		}
		errs, err := br.RenewBatch(ctx, reqs)
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
			l.applyRenew(sent, r.c.drv.Renew(ctx, l.grant(), l.opts.TTL))
		}()
	}
	wg.Wait()
}
