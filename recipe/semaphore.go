package recipe

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/fenced-dev/fenced"
)

// maxPermits is the largest number of permits a Semaphore may have; the
// CLI checks it as internal/core/limits.MaxPermits (a test ties them).
const maxPermits = 1024

// Semaphore lets up to N holders into a name at once. Each holder holds a
// lease of its own on one permit: the key name + "#" + slot ("pool#3"),
// for a slot in [0, N). A permit has its own fence and is renewed, lost
// and released like any lease. A holder that crashes frees its permit when
// the lease's TTL runs out at the store, so permits never leak.
//
// Every user of a name must agree on N. Permits are found by their keys.
// So a Semaphore with N=5 uses two permits that one with N=3 never looks
// at. The fence is per permit: it orders the holders of one slot, not the
// holders of different slots.
//
// Waiting is notified where the backend notifies. Some backends have a
// native queue (etcd, ZooKeeper) or release notifications (SQLite,
// PostgreSQL with LISTEN, Redis, mem). There a waiter waits on every permit
// at once and takes the first granted. Elsewhere it polls all permits with
// jittered backoff. It wakes no later than the soonest expiry it was told
// of.
type Semaphore struct {
	c       *fenced.Client
	name    string
	permits int
	opts    fenced.LeaseOptions
}

// permitKey returns the key of a semaphore's permit: name, '#', slot.
func permitKey(name string, slot int) string { return name + "#" + strconv.Itoa(slot) }

// NewSemaphore returns the semaphore of permits permits on name, whose
// permits are leases with opts (nil for the defaults). MaxWait says how
// long Acquire waits. It returns an error matching ErrInvalidOptions when
// permits is not in [1, 1024]. It returns ErrInvalidKey when a
// permit key would be invalid, or the error Client.Resolve gives for
// opts.
func NewSemaphore(c *fenced.Client, name string, permits int, opts *fenced.LeaseOptions) (*Semaphore, error) {
	if permits < 1 || permits > maxPermits {
		return nil, fmt.Errorf("fenced: semaphore %q: %w: %d permits, want 1 to %d", name, fenced.ErrInvalidOptions, permits, maxPermits)
	}
	if err := fenced.ValidateKey(name); err != nil {
		return nil, fmt.Errorf("fenced: semaphore: %w", err)
	}
	if err := fenced.ValidateKey(permitKey(name, permits-1)); err != nil {
		return nil, fmt.Errorf("fenced: semaphore: %w", err)
	}
	s := &Semaphore{c: c, name: name, permits: permits}
	if opts != nil {
		s.opts = *opts
	}
	if _, err := c.Resolve(&s.opts); err != nil {
		return nil, fmt.Errorf("fenced: semaphore %q: %w", name, err)
	}
	return s, nil
}

// Permit is one holder's lease on one slot of a Semaphore. Release it like
// any lease.
type Permit struct {
	*fenced.Lease
	slot int
}

// Slot returns the permit's slot, in [0, N).
func (p *Permit) Slot() int { return p.slot }

// TryAcquire takes a free permit, or fails at once with an error matching
// ErrHeld when all N are held.
func (s *Semaphore) TryAcquire(ctx context.Context) (*Permit, error) {
	p, _, err := s.round(fenced.WithKeyGroup(ctx, s.name))
	if err != nil {
		return nil, fmt.Errorf("fenced: semaphore %q: %w", s.name, err)
	}
	return p, nil
}

// Acquire takes a permit, waiting for one for up to MaxWait as
// Client.Acquire does. When the wait runs out the error matches ErrHeld;
// when ctx ends it matches ctx's cause.
func (s *Semaphore) Acquire(ctx context.Context) (*Permit, error) {
	p, err := s.acquire(fenced.WithKeyGroup(ctx, s.name))
	if err != nil {
		return nil, fmt.Errorf("fenced: semaphore %q: %w", s.name, err)
	}
	return p, nil
}

func (s *Semaphore) acquire(ctx context.Context) (*Permit, error) {
	spec, err := s.c.Resolve(&s.opts)
	if err != nil {
		return nil, err
	}
	p, hint, err := s.round(ctx)
	if err == nil || !errors.Is(err, fenced.ErrHeld) || spec.MaxWait == 0 {
		return p, err
	}
	if caps := s.c.Capabilities(); caps.Queue || caps.Subscribe {
		return s.race(ctx)
	}
	return s.poll(ctx, spec, hint)
}

// round tries every permit once, starting at a random slot so holders
// spread over the keys. It returns the first granted, or an error matching
// ErrHeld (with the soonest expiry any holder was known to have, zero when
// unknown) when all are held, or the last other error.
func (s *Semaphore) round(ctx context.Context) (*Permit, time.Duration, error) {
	start := rand.N(s.permits)
	var hint time.Duration
	var otherErr error
	for i := range s.permits {
		slot := (start + i) % s.permits
		l, err := s.c.TryAcquire(ctx, permitKey(s.name, slot), &s.opts)
		if err == nil {
			return &Permit{Lease: l, slot: slot}, 0, nil
		}
		var held *fenced.HeldError
		switch {
		case errors.As(err, &held):
			if held.Remaining > 0 && (hint == 0 || held.Remaining < hint) {
				hint = held.Remaining
			}
		case errors.Is(err, fenced.ErrHeld):
		default:
			otherErr = err
		}
	}
	if otherErr != nil {
		return nil, 0, otherErr
	}
	return nil, hint, fmt.Errorf("all %d permits are held: %w", s.permits, fenced.ErrHeld)
}

// race waits on every permit at once with the client's own waiting (native
// queue or notification) and keeps the first grant, releasing any other
// that arrives meanwhile.
func (s *Semaphore) race(ctx context.Context) (*Permit, error) {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		p   *Permit
		err error
	}
	results := make(chan result, s.permits)
	var wg sync.WaitGroup
	for slot := range s.permits {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := s.c.Acquire(rctx, permitKey(s.name, slot), &s.opts)
			if err != nil {
				results <- result{err: err}
				return
			}
			results <- result{p: &Permit{Lease: l, slot: slot}}
		}()
	}
	go func() {
		wg.Wait()
		close(results)
	}()
	var won *Permit
	var errs []error
	for r := range results {
		switch {
		case r.p != nil && won == nil:
			won = r.p
			cancel()
		case r.p != nil:
			// A second grant raced the first: give it back.
			relCtx, relCancel := context.WithTimeout(context.WithoutCancel(ctx), s.c.Options().CloseTimeout)
			_ = r.p.Release(relCtx)
			relCancel()
		case won == nil:
			errs = append(errs, r.err)
		}
	}
	if won != nil {
		return won, nil
	}
	if ctx.Err() != nil {
		return nil, context.Cause(ctx)
	}
	for _, err := range errs {
		if !errors.Is(err, fenced.ErrHeld) {
			return nil, err
		}
	}
	return nil, errs[0]
}

// poll retries rounds with jittered backoff, no later than the soonest
// known expiry, until MaxWait runs out.
func (s *Semaphore) poll(ctx context.Context, spec fenced.LeaseOptions, hint time.Duration) (*Permit, error) {
	var waitOver <-chan time.Time
	if spec.MaxWait != fenced.WaitForever {
		t := s.c.Options().Clock.NewTimer(spec.MaxWait)
		defer t.Stop()
		waitOver = t.C()
	}
	for attempt := 0; ; attempt++ {
		sleep := backoff(s.c.Options(), attempt)
		if hint > 0 {
			sleep = min(sleep, hint+time.Millisecond)
		}
		t := s.c.Options().Clock.NewTimer(sleep)
		select {
		case <-t.C():
		case <-waitOver:
			t.Stop()
			return nil, fmt.Errorf("gave up after waiting %v: all %d permits are held: %w", spec.MaxWait, s.permits, fenced.ErrHeld)
		case <-ctx.Done():
			t.Stop()
			return nil, context.Cause(ctx)
		}
		p, h, err := s.round(ctx)
		if err == nil || !errors.Is(err, fenced.ErrHeld) {
			return p, err
		}
		hint = h
	}
}
