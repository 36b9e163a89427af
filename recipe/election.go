package recipe

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fenced-dev/fenced"
)

// Election is leader election on one name: a lease on the name, held for as
// long as the leader leads. The lease's fence is the leader's epoch. Every
// new leader has a higher one. So a resource that remembers the highest
// epoch it has seen refuses a deposed leader. Pass the leadership's Fence as the
// fence and the name as the key to a guard in package fence.
//
// An Election works on every backend, with the guarantees the backend
// declares. On etcd and ZooKeeper candidates wait in a FIFO queue;
// elsewhere they are woken by notification or poll. On etcd it uses
// etcd's own election key layout, so `etcdctl elect` on the same name
// (etcd.Driver.LockName) and fenced exclude each other.
//
// A leader cut off from the store stops leading (its context is
// cancelled) before the store can elect another. docs/recipes.md compares
// it with other elections.
//
// An Election is safe for concurrent use; each Campaign is one candidacy.
type Election struct {
	c    *fenced.Client
	name string
	opts fenced.LeaseOptions
}

// NewElection returns the election on name (validated like a key), whose
// leaderships are leases with opts (nil for the defaults). MaxWait is
// ignored: Campaign waits until its context ends. It returns an error
// matching ErrInvalidKey, ErrInvalidOptions or ErrNoFence when name or
// opts cannot be used.
func NewElection(c *fenced.Client, name string, opts *fenced.LeaseOptions) (*Election, error) {
	if err := fenced.ValidateKey(name); err != nil {
		return nil, fmt.Errorf("fenced: election: %w", err)
	}
	e := &Election{c: c, name: name}
	if opts != nil {
		e.opts = *opts
	}
	e.opts.MaxWait = fenced.WaitForever
	if _, err := c.Resolve(&e.opts); err != nil {
		return nil, fmt.Errorf("fenced: election %q: %w", name, err)
	}
	return e, nil
}

// canProclaim reports whether the backend publishes a leader's value
// (Client.Capabilities().Value: etcd and mem). Elsewhere Campaign with a
// non-empty value and Leadership.SetValue return ErrUnsupported, and Observe reports
// leaders without a value.
func (e *Election) canProclaim() bool { return e.c.Capabilities().Value }

// Campaign blocks until this process is the leader or ctx ends, and
// returns the leadership. value is published for observers (see
// Client.Capabilities().Value); with "" nothing is published. A store that is unavailable
// or answers with an unknown outcome is retried with backoff until ctx
// ends. Other errors (ErrNoFence, ErrClosed, ErrUnsupported) are returned
// at once. When ctx ends the error matches ctx's cause.
//
// The leadership outlives ctx: end it with Release.
func (e *Election) Campaign(ctx context.Context, value string) (*Leadership, error) {
	valuer := e.canProclaim()
	if value != "" && !valuer {
		return nil, fmt.Errorf("fenced: campaign %q: %w: this backend keeps no leader's value (etcd and mem do); campaign with none",
			e.name, fenced.ErrUnsupported)
	}
	for attempt := 0; ; attempt++ {
		l, err := e.c.Acquire(ctx, e.name, &e.opts)
		if err == nil {
			ld := &Leadership{Lease: l, e: e}
			if !valuer {
				return ld, nil
			}
			// Always write the value, even "": until then etcd's key
			// holds the owner token.
			if err = ld.publish(ctx, value); err == nil {
				return ld, nil
			}
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.c.Options().CloseTimeout)
			_ = l.Release(rctx)
			cancel()
		}
		if !errors.Is(err, fenced.ErrUnavailable) && !errors.Is(err, fenced.ErrUnknownOutcome) && !errors.Is(err, fenced.ErrNotHeld) {
			return nil, err
		}
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		t := e.c.Options().Clock.NewTimer(backoff(e.c.Options(), attempt))
		select {
		case <-t.C():
		case <-ctx.Done():
			t.Stop()
			return nil, context.Cause(ctx)
		}
	}
}

// Leader returns the current leader, or a Leader with Present false when
// nobody leads. Its Epoch is then the last leader's, zero if none ever
// led.
func (e *Election) Leader(ctx context.Context) (Leader, error) {
	var (
		info  fenced.LeaseInfo
		value string
		err   error
	)
	if e.canProclaim() {
		info, value, err = e.c.Value(ctx, e.name)
	} else {
		info, err = e.c.Inspect(ctx, e.name)
	}
	if errors.Is(err, fenced.ErrNotFound) {
		return Leader{}, nil
	}
	if err != nil {
		return Leader{}, fmt.Errorf("fenced: leader of %q: %w", e.name, err)
	}
	return Leader{Present: info.Held, Epoch: info.Fence, Value: value, Owner: info.Owner, remaining: info.Remaining}, nil
}

// Leader is one state of an election as Observe and Leader report it.
type Leader struct {
	// Present is false when nobody leads.
	Present bool
	// Epoch is the leader's fence; with Present false, the last leader's
	// (zero when nobody ever led).
	Epoch uint64
	// Value is what the leader proclaimed ("" when it proclaimed nothing,
	// or the backend has no value slot).
	Value string
	// Owner is the leader's owner token shortened (never the whole token),
	// as LeaseInfo.Owner.
	Owner string
	// remaining is the time left on the leader's lease by the store's
	// clock when it was read, zero when unknown: Observe's next read.
	remaining time.Duration
}

// same reports whether l and m are the same state of the election.
func (l Leader) same(m Leader) bool {
	return l.Present == m.Present && l.Epoch == m.Epoch && l.Value == m.Value
}

// String describes the leader for logs.
func (l Leader) String() string {
	if !l.Present {
		return fmt.Sprintf("no leader (last epoch %d)", l.Epoch)
	}
	return fmt.Sprintf("leader epoch %d value %q", l.Epoch, l.Value)
}

// observeEvery is how often Observe reads the election when the backend
// cannot tell it of a change.
const observeEvery = 250 * time.Millisecond

// Observe reports the election's changes on the returned channel, which is
// closed when ctx ends. First comes the current state, then every new
// leader, every change of the leader's value, and "no leader" (Present
// false) whenever nobody leads. A term short enough to begin and end
// between two reads may go unreported. Between two different leaders it
// always reports "no leader" first. It does so even when it did not read
// the store in the moment between them. Leaderships never overlap, so the
// first ended before the second began. Errors reading the store are not
// reported; Observe keeps trying, and reports the state it reads next.
//
// Observe reads the store every 250ms, when the leader's lease is due to
// expire, and at once on a release where the backend notifies observers
// (Client.Watch); an observer never takes the wake-up a release gives the
// candidates. A slow receiver delays reading, never drops a change.
func (e *Election) Observe(ctx context.Context) <-chan Leader {
	ch := make(chan Leader)
	go e.observe(ctx, ch)
	return ch
}

func (e *Election) observe(ctx context.Context, ch chan<- Leader) {
	defer close(ch)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	send := func(l Leader) bool {
		select {
		case ch <- l:
			return true
		case <-ctx.Done():
			return false
		}
	}
	// Only an observer's subscription: a waiter's could take the one
	// wake-up a release gives the candidates (Client.Watch). Where the
	// store cannot tell observers, subC stays nil: a timer reads it.
	subC, _ := e.c.Watch(ctx, e.name)
	var (
		last  Leader
		first = true
	)
	for ctx.Err() == nil {
		wait := observeEvery
		cur, err := e.Leader(ctx)
		if err == nil {
			switch {
			case first:
				first = false
				if !send(cur) {
					return
				}
			case cur.same(last), !cur.Present && !last.Present:
				// Nobody leads still (a term may have come and gone
				// unseen between two reads).
			case last.Present && cur.Present && cur.Epoch != last.Epoch:
				if !send(Leader{Epoch: last.Epoch}) || !send(cur) {
					return
				}
			default:
				if !send(cur) {
					return
				}
			}
			last = cur
			if cur.Present && cur.remaining > 0 {
				wait = min(wait, cur.remaining+time.Millisecond)
			}
		}
		t := e.c.Options().Clock.NewTimer(wait)
		select {
		case <-t.C():
		case <-subC:
		case <-ctx.Done():
		}
		t.Stop()
	}
}

// Leadership is one term of this process as leader: the lease on the
// election's name, with which it proclaims its value (SetValue). The lease's Fence is the
// term's epoch, higher than every earlier leader's: send it with every
// command, and have followers and resources refuse an epoch lower than the
// highest they have seen. Lead under its Context, cancelled with the
// lease's cause the moment leadership is lost or released. Err is nil while
// this process leads, then why the term ended: IsLost for a loss,
// ErrReleased after Release, ErrClosed after the client was closed.
//
// Release ends the term: the context is cancelled first, then the lease is
// released so another candidate can lead. Releasing a term that was already
// lost returns an error matching ErrNotHeld. A process that campaigns again
// at once may win again on backends that do not queue candidates in order;
// wait a while first to hand leadership over.
//
// Its methods are safe for concurrent use.
type Leadership struct {
	*fenced.Lease
	e *Election
}

// SetValue proclaims value as the leader's value without a new election
// (observers see a change with the same epoch). It returns an error
// matching ErrUnsupported on backends without a value slot (see
// Client.Capabilities().Value). It returns ErrNotHeld (or the term's end
// cause) when this process no longer leads.
func (l *Leadership) SetValue(ctx context.Context, value string) error {
	if !l.e.canProclaim() {
		return fmt.Errorf("fenced: proclaim %q: %w: this backend has no slot for a leader's value", l.e.name, fenced.ErrUnsupported)
	}
	return l.publish(ctx, value)
}

func (l *Leadership) publish(ctx context.Context, value string) error {
	if err := l.Lease.Err(); err != nil {
		return fmt.Errorf("fenced: proclaim %q: %w", l.e.name, err)
	}
	if err := l.Lease.SetValue(ctx, value); err != nil {
		if errors.Is(err, fenced.ErrNotHeld) {
			// The store no longer has this grant. A renewal asks it
			// once more and, refused, ends the lease with ErrLost.
			_ = l.Lease.Renew(ctx)
		}
		return fmt.Errorf("fenced: proclaim %q: %w", l.e.name, err)
	}
	return nil
}

// Callbacks are the client-go-style form of an election; see Election.Run.
// Every field may be nil.
type Callbacks struct {
	// OnStartedLeading runs when this process becomes leader, with a
	// context cancelled when leadership is lost (or Run's ctx ends). It
	// must return promptly once ctx is cancelled: the lease is released
	// only after it returns. When it returns on its own, the process
	// resigns.
	OnStartedLeading func(ctx context.Context, l *Leadership)
	// OnStoppedLeading runs after a term that started has ended and
	// OnStartedLeading has returned, with why the term ended (IsLost for a
	// loss, ErrReleased for a resignation). It never runs for a process
	// that did not lead.
	OnStoppedLeading func(cause error)
	// OnNewLeader runs for every change Observe reports, this process's
	// own term included, one call at a time, until Run returns.
	OnNewLeader func(Leader)
}

// Run campaigns with value, leads with cb.OnStartedLeading, resigns when it
// returns, calls cb.OnStoppedLeading and returns. It runs one term per
// call, as client-go's LeaderElector.Run. Call it again to stand again. It
// returns nil after a resignation, the cause (IsLost) after a loss, or an
// error from Campaign. That error is ctx's cause when ctx ended before this
// process led.
func (e *Election) Run(ctx context.Context, value string, cb Callbacks) error {
	if cb.OnNewLeader != nil {
		octx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		defer func() {
			stop()
			<-done
		}()
		go func() {
			defer close(done)
			for l := range e.Observe(octx) {
				cb.OnNewLeader(l)
			}
		}()
	}
	ld, err := e.Campaign(ctx, value)
	if err != nil {
		return err
	}
	lctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(ld.Context(), func() { cancel(context.Cause(ld.Context())) })
	if cb.OnStartedLeading != nil {
		cb.OnStartedLeading(lctx, ld)
	}
	stop()
	cancel(fenced.ErrReleased)
	cause := ld.Err()
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), e.c.Options().CloseTimeout)
	relErr := ld.Release(rctx)
	rcancel()
	if cause == nil {
		cause = fenced.ErrReleased
		if relErr != nil && errors.Is(relErr, fenced.ErrNotHeld) {
			cause = fmt.Errorf("%w: %v", fenced.ErrLost, relErr)
		}
	}
	if cb.OnStoppedLeading != nil {
		cb.OnStoppedLeading(cause)
	}
	if errors.Is(cause, fenced.ErrReleased) {
		return nil
	}
	return cause
}
