package recipe

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/fenced-dev/fenced"
)

// AcquireAll acquires a lease on every key, all or nothing. It takes the
// keys in one canonical order (sorted bytewise, whatever order they were
// given in). So two callers that need overlapping sets can never deadlock by
// each holding a key the other waits for. MaxWait (see LeaseOptions) bounds
// the whole acquisition, not each key. Some key may still be held when it
// runs out, or anything else may fail. The leases already taken are then
// released (in reverse order), and the error says which key failed.
//
// Once the last key is granted, every earlier lease is renewed once. A lease
// broken or expired while AcquireAll waited for a later key then fails the
// whole call. It is not handed out. The leases are released, and the error
// names the key. So the set starts with every lease confirmed after the
// last grant was. That costs about one round trip for two keys or more.
//
// The returned set's context is cancelled, with that lease's cause, when
// any one of its leases ends. So work under it stops the moment a single
// key is lost. Each lease keeps its own fence: send each resource the fence
// of the key that protects it (LeaseSet.Fences).
//
// keys must be non-empty and name no key twice; errors match ErrInvalidKey
// then. opts may be nil.
func AcquireAll(ctx context.Context, c *fenced.Client, keys []string, opts *fenced.LeaseOptions) (*LeaseSet, error) {
	ordered, err := canonicalKeys(keys)
	if err != nil {
		return nil, fmt.Errorf("fenced: acquire all: %w", err)
	}
	spec, err := c.Resolve(opts)
	if err != nil {
		return nil, fmt.Errorf("fenced: acquire all: %w", err)
	}
	var o fenced.LeaseOptions
	if opts != nil {
		o = *opts
	}
	var deadline time.Time
	if spec.MaxWait != 0 && spec.MaxWait != fenced.WaitForever {
		deadline = c.Options().Clock.Now().Add(spec.MaxWait)
	}
	set := &LeaseSet{c: c}
	for _, key := range ordered {
		if !deadline.IsZero() {
			left := deadline.Sub(c.Options().Clock.Now())
			if left <= 0 {
				// Wait once more, as little as possible: a free key is
				// still taken, a held one fails at once.
				o.MaxWait = 0
			} else {
				o.MaxWait = left
			}
		}
		l, err := c.Acquire(ctx, key, &o)
		if err != nil {
			set.releaseAll(ctx)
			return nil, fmt.Errorf("fenced: acquire all %q: took %d of %d keys in order, released them: %w",
				ordered, len(set.leases), len(ordered), err)
		}
		set.leases = append(set.leases, l)
	}
	if err := set.confirm(ctx); err != nil {
		set.releaseAll(ctx)
		return nil, fmt.Errorf("fenced: acquire all %q: took all %d keys, but %w; released them", ordered, len(ordered), err)
	}
	set.start(ctx)
	return set, nil
}

// confirm checks, once the last lease is granted, that the earlier ones are
// still held. While AcquireAll waited for a later key, an earlier lease may
// have been broken or have expired at the authority. That lease would learn
// of it only at its next renewal. Each earlier lease is renewed once
// (concurrently, so about one round trip in all), and any lease that has
// ended, or whose renewal is refused, fails the set. A renewal that fails
// for another reason (the store did not answer) leaves the lease as its
// local validity says: held, and not Healthy.
func (s *LeaseSet) confirm(ctx context.Context) error {
	errs := make([]error, len(s.leases))
	var wg sync.WaitGroup
	for i, l := range s.leases[:len(s.leases)-1] {
		if l.FailedOpen() {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = l.Renew(ctx)
		}()
	}
	wg.Wait()
	for i, l := range s.leases {
		if err := l.Err(); err != nil {
			return fmt.Errorf("the lease on %q ended meanwhile: %w", l.Key(), err)
		}
		if errors.Is(errs[i], fenced.ErrNotHeld) {
			return fmt.Errorf("the lease on %q was lost meanwhile: %w", l.Key(), errs[i])
		}
	}
	return nil
}

// canonicalKeys validates keys and returns them sorted.
func canonicalKeys(keys []string) ([]string, error) {
	if len(keys) == 0 {
		return nil, fmt.Errorf("%w: no keys", fenced.ErrInvalidKey)
	}
	ordered := slices.Clone(keys)
	slices.Sort(ordered)
	for i, k := range ordered {
		if err := fenced.ValidateKey(k); err != nil {
			return nil, err
		}
		if i > 0 && ordered[i-1] == k {
			return nil, fmt.Errorf("%w: key %q is named twice", fenced.ErrInvalidKey, k)
		}
	}
	return ordered, nil
}

// LeaseSet is the leases AcquireAll took, one per key, in canonical order.
// Its methods are safe for concurrent use.
type LeaseSet struct {
	c      *fenced.Client
	leases []*fenced.Lease

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
	var ctx context.Context
	ctx, s.cancel = context.WithCancelCause(context.WithoutCancel(parent))
	s.ctx = setContext{Context: ctx, s: s}
	for _, l := range s.leases {
		s.stops = append(s.stops, context.AfterFunc(l.Context(), func() { s.lost(l) }))
	}
}

// lost cancels the set's context with the cause of l, which has ended
// (unless the set's context was cancelled already).
func (s *LeaseSet) lost(l *fenced.Lease) {
	s.cancel(fmt.Errorf("lease on %q: %w", l.Key(), context.Cause(l.Context())))
}

// check cancels the set's context if a lease has ended and the AfterFunc
// that does so has not run yet, so that the set never reports itself live
// while one of its leases is not. It asks each lease's Err, which reads
// the client's clock, not the lease's context: the client's schedule
// cancels that context when the validity runs out, but its timer may fire
// late (a process starved of CPU), and meanwhile the store may have
// granted the key to someone else.
func (s *LeaseSet) check() {
	for _, l := range s.leases {
		if l.Err() != nil {
			s.lost(l)
			return
		}
	}
}

// setContext is a LeaseSet's context: its Err and Done look at the
// set's leases first (see LeaseSet.check), so a lease's end, its validity
// running out included, shows in them at once, not only once the client's
// schedule and the AfterFunc that cancels the set have run.
type setContext struct {
	context.Context
	s *LeaseSet
}

// Done implements context.Context.
func (c setContext) Done() <-chan struct{} {
	c.s.check()
	return c.Context.Done()
}

// Err implements context.Context.
func (c setContext) Err() error {
	c.s.check()
	return c.Context.Err()
}

// Leases returns the leases in canonical (sorted) key order.
func (s *LeaseSet) Leases() []*fenced.Lease { return slices.Clone(s.leases) }

// Context returns a context cancelled when any lease of the set ends, with
// a cause naming the key. The cause matches that lease's cause: IsLost for
// a loss, ErrExpired once a lease's validity has run out, ErrReleased after
// Release. Its Err and Done reflect a lease's end as soon as that lease's
// Err does: they read the client's clock, so they say a lease is over
// even when the client's schedule, which cancels it, runs late.
func (s *LeaseSet) Context() context.Context { return s.ctx }

// Err returns nil while every lease is held, and afterwards the cause of
// the first to end. The set is healthy only while all its leases are: Err
// is not nil once any lease's Err is not.
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
// (each matching ErrNotHeld for a lease that was lost). A second call
// waits for the first and returns its result.
func (s *LeaseSet) Release(ctx context.Context) error {
	s.once.Do(func() {
		s.cancel(fenced.ErrReleased)
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
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.c.Options().CloseTimeout)
	defer cancel()
	var errs []error
	for i := len(s.leases) - 1; i >= 0; i-- {
		if err := s.leases[i].Release(rctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
