package fenced

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// AcquireAll acquires a lease on every key, all or nothing. It takes the
// keys in one canonical order (sorted bytewise, whatever order they were
// given in), so two callers that need overlapping sets can never deadlock
// by each holding a key the other waits for. MaxWait (see LeaseOptions)
// bounds the whole acquisition, not each key: if some key is still held
// when it runs out, or anything else fails, the leases already taken are
// released (in reverse order) and the error says which key failed.
//
// The returned set's context is cancelled, with that lease's cause, when
// any one of its leases ends, so work under it stops the moment a single
// key is lost. Each lease keeps its own fence: send each resource the fence
// of the key that protects it (LeaseSet.Fences).
//
// keys must be non-empty and name no key twice; errors match ErrInvalidKey
// then. opts may be nil.
func (c *Client) AcquireAll(ctx context.Context, keys []string, opts *LeaseOptions) (*LeaseSet, error) {
	ordered, err := canonicalKeys(keys)
	if err != nil {
		return nil, fmt.Errorf("fenced: acquire all: %w", err)
	}
	spec, err := c.Resolve(opts)
	if err != nil {
		return nil, fmt.Errorf("fenced: acquire all: %w", err)
	}
	var o LeaseOptions
	if opts != nil {
		o = *opts
	}
	var deadline time.Time
	if spec.MaxWait != NoWait && spec.MaxWait != WaitForever {
		deadline = c.clock.Now().Add(spec.MaxWait)
	}
	set := &LeaseSet{c: c}
	for _, key := range ordered {
		if !deadline.IsZero() {
			left := deadline.Sub(c.clock.Now())
			if left <= 0 {
				// Wait once more, as little as possible: a free key is
				// still taken, a held one fails at once.
				o.MaxWait = NoWait
			} else {
				o.MaxWait = left
			}
		}
		l, err := c.Acquire(ctx, key, &o)
		if err != nil {
			set.releaseAll(ctx)
			return nil, fmt.Errorf("fenced: acquire all %q: took %d of %d keys in order, released them: %w", ordered, len(set.leases), len(ordered), err)
		}
		set.leases = append(set.leases, l)
	}
	set.start(ctx)
	return set, nil
}

// canonicalKeys validates keys and returns them sorted.
func canonicalKeys(keys []string) ([]string, error) {
	if len(keys) == 0 {
		return nil, fmt.Errorf("%w: no keys", ErrInvalidKey)
	}
	ordered := slices.Clone(keys)
	slices.Sort(ordered)
	for i, k := range ordered {
		if err := ValidateKey(k); err != nil {
			return nil, err
		}
		if i > 0 && ordered[i-1] == k {
			return nil, fmt.Errorf("%w: key %q is named twice", ErrInvalidKey, k)
		}
	}
	return ordered, nil
}

// LeaseSet is the leases AcquireAll took, one per key, in canonical order.
// Its methods are safe for concurrent use.
type LeaseSet struct {
	c      *Client
	leases []*Lease

	ctx    context.Context
	cancel context.CancelCauseFunc
	stops  []func() bool
	once   sync.Once
	relErr error
	done   chan struct{}
}

// start derives the shared context: cancelled with the cause of the first
// lease to end.
func (s *LeaseSet) start(parent context.Context) {
	s.done = make(chan struct{})
	s.ctx, s.cancel = context.WithCancelCause(context.WithoutCancel(parent))
	for _, l := range s.leases {
		s.stops = append(s.stops, context.AfterFunc(l.Context(), func() {
			s.cancel(fmt.Errorf("lease on %q: %w", l.Key(), context.Cause(l.Context())))
		}))
	}
}

// Leases returns the leases in canonical (sorted) key order.
func (s *LeaseSet) Leases() []*Lease { return slices.Clone(s.leases) }

// Keys returns the keys in canonical order.
func (s *LeaseSet) Keys() []string {
	keys := make([]string, len(s.leases))
	for i, l := range s.leases {
		keys[i] = l.Key()
	}
	return keys
}

// Fences returns each key's fence.
func (s *LeaseSet) Fences() map[string]uint64 {
	m := make(map[string]uint64, len(s.leases))
	for _, l := range s.leases {
		m[l.Key()] = l.Fence()
	}
	return m
}

// Context returns a context cancelled when any lease of the set ends, with
// a cause naming the key and matching that lease's cause (IsLost for a
// loss, ErrReleased after Release).
func (s *LeaseSet) Context() context.Context { return s.ctx }

// Done is closed when any lease of the set has ended.
func (s *LeaseSet) Done() <-chan struct{} { return s.ctx.Done() }

// Err returns nil while every lease is held, and afterwards the cause of
// the first to end.
func (s *LeaseSet) Err() error {
	if s.ctx.Err() == nil {
		return nil
	}
	return context.Cause(s.ctx)
}

// Remaining returns the least local validity left on any lease.
func (s *LeaseSet) Remaining() time.Duration {
	left := time.Duration(-1)
	for _, l := range s.leases {
		if r := l.Remaining(); left < 0 || r < left {
			left = r
		}
	}
	return max(left, 0)
}

// Release cancels the set's context with ErrReleased, then releases every
// lease in reverse order. It returns the errors of the releases joined
// (each matching ErrNotHeld for a lease that was lost); a second call
// waits for the first and returns its result.
func (s *LeaseSet) Release(ctx context.Context) error {
	s.once.Do(func() {
		s.cancel(ErrReleased)
		for _, stop := range s.stops {
			stop()
		}
		s.relErr = s.releaseAll(ctx)
		close(s.done)
	})
	select {
	case <-s.done:
		return s.relErr
	case <-ctx.Done():
		return fmt.Errorf("fenced: release all: %w", context.Cause(ctx))
	}
}

// releaseAll releases the leases in reverse order, with a fresh timeout
// of Options.CloseTimeout so that it happens even when ctx has ended.
func (s *LeaseSet) releaseAll(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.c.opts.CloseTimeout)
	defer cancel()
	var errs []error
	for i := len(s.leases) - 1; i >= 0; i-- {
		if err := s.leases[i].Release(rctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
