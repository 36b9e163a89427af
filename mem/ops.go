package mem

import (
	"context"
	"fmt"
	"github.com/fenced-dev/fenced/internal/core/limits"
	"slices"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/clock"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/core/ttlrule"
)

// The optional operations of driver.Capabilities, every one of them, so
// that mem is the reference of each and a test double that needs no server.

var (
	_ driver.TimedQueuer   = (*Driver)(nil)
	_ driver.TermsAcquirer = (*Driver)(nil)
	_ driver.BatchRenewer  = (*Driver)(nil)
	_ driver.LossWatcher   = (*Driver)(nil)
	_ driver.FenceFloorer  = (*Driver)(nil)
)

// Capabilities implements driver.Driver: every optional operation, those
// that stand in for a Driver method (the FIFO queue, terms, batches) when
// Options ask for them. Without Options.Queue waiters are woken through
// Subscribe, as on most backends.
func (d *Driver) Capabilities() driver.Capabilities {
	c := d.guarantees()
	c.Subscribe, c.Observe, c.WatchLoss, c.BreakLog, c.Value, c.FenceFloor = true, true, true, true, true, true
	c.Queue, c.FIFO, c.Terms, c.BatchRenew = d.opts.Queue, d.opts.Queue, d.opts.Terms, d.opts.BatchRenew
	c.Keeps = driver.Expiry{MinTTL: d.opts.MinTTL, MaxTTL: d.opts.MaxTTL}
	c.Checkpoint = true
	return c
}

// grant makes e, the state of key, a new grant to owner for ttl: its fence
// is above the key's counter and the store's floor. A previous holder's
// loss watches learn that their grant is lost.
func (s *Store) grant(key string, e *entry, owner string, ttl time.Duration, now time.Time) uint64 {
	if len(s.watches[key]) > 0 { // the error is made only for a watch
		s.lose(key, fmt.Errorf("%w: %s was granted again", fenced.ErrLost, key))
	}
	e.fence = max(e.fence, s.floor) + 1
	e.owner = owner
	e.expires = now.Add(ttl)
	e.value = ""
	return e.fence
}

// end ends key's grant at now. lost is the error its loss watches get (nil
// for a release by its owner, which loses nothing); the key's waiters and
// the head of its queue are woken.
func (s *Store) end(key string, e *entry, now time.Time, lost error) {
	if lost != nil {
		s.lose(key, lost)
	}
	delete(s.watches, key)
	e.owner = ""
	e.expires = time.Time{}
	e.ended = now
	s.notify(key)
}

// ended returns when e's last grant ended: at its release or break, or at
// its expiry.
func (e *entry) endedAt() time.Time {
	if e.owner != "" {
		return e.expires
	}
	return e.ended
}

// TryAcquireTerms implements driver.TermsAcquirer (with Options.Terms;
// otherwise it refuses with fenced.ErrUnsupported). mem's grant needs
// nothing of the terms beyond the TTL: it is TryAcquire with ttl.
func (d *Driver) TryAcquireTerms(ctx context.Context, key, owner string, ttl, _ time.Duration) (uint64, error) {
	if !d.opts.Terms {
		return 0, fmt.Errorf("mem: acquire on terms: %w: the driver was opened without Options.Terms", fenced.ErrUnsupported)
	}
	return d.TryAcquire(ctx, key, owner, ttl)
}

// RenewBatch implements driver.BatchRenewer (with Options.BatchRenew;
// otherwise it refuses with fenced.ErrUnsupported): every grant renewed as
// Renew does, in one step under the store's lock.
func (d *Driver) RenewBatch(ctx context.Context, grants []driver.Grant) ([]error, error) {
	if !d.opts.BatchRenew {
		return nil, fmt.Errorf("mem: renew a batch: %w: the driver was opened without Options.BatchRenew", fenced.ErrUnsupported)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := ttlrule.CheckAll(grants); err != nil {
		return nil, err
	}
	s, err := d.lock()
	if err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	now := s.clock.Now()
	errs := make([]error, len(grants))
	for i, g := range grants {
		errs[i] = s.renew(g, now)
	}
	return errs, nil
}

// renew extends g by its TTL, if it is the current grant of its key.
func (s *Store) renew(g driver.Grant, now time.Time) error {
	e, err := s.heldAt(g, now)
	if err != nil {
		return err
	}
	e.expires = now.Add(g.TTL)
	return nil
}

// lossWatch is one WatchLoss.
type lossWatch struct {
	g    driver.Grant
	lost func(error)
}

// WatchLoss implements driver.LossWatcher: a grant is reported lost when it
// is broken or granted again after it expired. lost is called under the
// store's lock, which stop takes, so that it is never called after stop
// returns.
func (d *Driver) WatchLoss(g driver.Grant, lost func(error)) (func(), error) {
	s, err := d.lock()
	if err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	if _, err := s.held(g); err != nil {
		return nil, err
	}
	w := &lossWatch{g: g, lost: lost}
	if s.watches == nil {
		s.watches = map[string][]*lossWatch{}
	}
	s.watches[g.Key] = append(s.watches[g.Key], w)
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.watches[g.Key] = slices.DeleteFunc(s.watches[g.Key], func(o *lossWatch) bool { return o == w })
		if len(s.watches[g.Key]) == 0 {
			delete(s.watches, g.Key)
		}
	}, nil
}

// lose tells the loss watches of key's current grant that it is lost.
func (s *Store) lose(key string, err error) {
	e := s.keys[key]
	for _, w := range s.watches[key] {
		if e != nil && w.g.Fence == e.fence && w.g.Owner == e.owner {
			w.lost(err)
		}
	}
	delete(s.watches, key)
}

// FenceFloor implements driver.FenceFloorer.
func (d *Driver) FenceFloor(ctx context.Context) (floor, maxFence uint64, err error) {
	s, err := d.lock()
	if err != nil {
		return 0, 0, err
	}
	defer s.mu.Unlock()
	for _, e := range s.keys {
		maxFence = max(maxFence, e.fence)
	}
	return s.floor, maxFence, nil
}

// RaiseFenceFloor implements driver.FenceFloorer.
func (d *Driver) RaiseFenceFloor(ctx context.Context, floor uint64) (uint64, error) {
	if floor > limits.MaxFenceFloor {
		return 0, fmt.Errorf("%w: %d is above %d", fenced.ErrInvalidFloor, floor, limits.MaxFenceFloor)
	}
	s, err := d.lockCtx(ctx)
	if err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	s.floor = max(s.floor, floor)
	return s.floor, nil
}

// Prune implements driver.FenceFloorer, in one step under the store's lock.
func (d *Driver) Prune(ctx context.Context, olderThan time.Duration) (deleted int64, floor uint64, err error) {
	if olderThan < 0 {
		return 0, 0, fmt.Errorf("%w: prune older than %v: negative", fenced.ErrInvalidTTL, olderThan)
	}
	s, err := d.lockCtx(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer s.mu.Unlock()
	now := s.clock.Now()
	for k, e := range s.keys {
		if e.heldAt(now) || len(s.queues[k]) > 0 || now.Sub(e.endedAt()) <= olderThan {
			continue
		}
		s.floor = max(s.floor, e.fence)
		delete(s.keys, k)
		deleted++
	}
	return deleted, s.floor, nil
}

// ticket is one waiter in a key's queue; next is signalled when it may
// have become the head with the key free.
type ticket struct{ next chan struct{} }

// AcquireTimed implements driver.TimedQueuer: a FIFO queue of waiters per
// key. Only the head of a key's queue is granted it, when the key is free
// (released, broken, or expired by the store's clock). A TryAcquire while
// anyone queues is refused, so nobody overtakes the queue. A driver opened
// without Options.Queue does not declare it and refuses with
// fenced.ErrUnsupported.
func (d *Driver) AcquireTimed(ctx context.Context, key, owner string, ttl time.Duration) (uint64, time.Time, error) {
	if !d.opts.Queue {
		return 0, time.Time{}, fmt.Errorf("mem: wait in a queue: %w: the driver was opened without Options.Queue", fenced.ErrUnsupported)
	}
	s, err := d.lockCtx(ctx)
	if err != nil {
		return 0, time.Time{}, err
	}
	t := &ticket{next: make(chan struct{}, 1)}
	if s.queues == nil {
		s.queues = map[string][]*ticket{}
	}
	s.queues[key] = append(s.queues[key], t)
	for {
		now := s.clock.Now()
		e := s.keys[key]
		if s.queues[key][0] == t && (e == nil || !e.heldAt(now) || e.owner == owner) {
			s.dequeue(key, t)
			confirmed := time.Now()
			fence, err := s.tryLocked(key, owner, ttl, now, true)
			s.mu.Unlock()
			return fence, confirmed, err
		}
		var timer clock.Timer
		var expiry <-chan time.Time
		if e != nil && e.heldAt(now) {
			timer = clock.NewTimerAt(s.clock, e.expires)
			expiry = timer.C()
		}
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			err = context.Cause(ctx)
		case <-t.next:
		case <-expiry:
		}
		if timer != nil {
			timer.Stop()
		}
		if err == nil {
			_, err = d.lock()
		}
		if err != nil {
			s.mu.Lock()
			s.dequeue(key, t)
			s.mu.Unlock()
			return 0, time.Time{}, err
		}
	}
}

// dequeue takes t out of key's queue and signals the new head.
func (s *Store) dequeue(key string, t *ticket) {
	q := slices.DeleteFunc(s.queues[key], func(o *ticket) bool { return o == t })
	if len(q) == 0 {
		delete(s.queues, key)
		return
	}
	s.queues[key] = q
	s.signalHead(key)
}

// signalHead wakes the head of key's queue, if any.
func (s *Store) signalHead(key string) {
	if q := s.queues[key]; len(q) > 0 {
		select {
		case q[0].next <- struct{}{}:
		default:
		}
	}
}
