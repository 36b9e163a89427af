// Package fencedgocron plugs fenced into gocron v2
// (github.com/go-co-op/gocron/v2): a Locker, so that each run of a job
// happens on one scheduler instance only, and an Elector, so that one
// instance runs them all.
//
//	locker, err := fencedgocron.NewLocker(client, nil)
//	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
//
// # Minimum hold
//
// gocron asks the locker for the job's key at each tick and unlocks it when
// the job returns. A job shorter than the spread of the instances' ticks
// (their clocks, their start times, the Go scheduler) is otherwise run
// twice: one instance finishes and frees the key before another's tick
// comes (go-co-op/gocron#841). The Locker keeps each lease until MinHold
// after its grant (default DefaultMinHold), in the background after Unlock
// returns, so the late instance finds the key held and skips that run.
// Choose MinHold above the spread and below the job's interval.
//
// Close the fenced Client when the scheduler has shut down: it releases the
// leases still kept for their minimum hold, which otherwise expire after
// their TTL.
package fencedgocron

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/recipe"
)

// DefaultMinHold is the Locker's minimum hold when Options.Lease.MinHold is
// zero: longer than the tick spread of instances on one network, shorter
// than gocron's shortest useful interval (a second).
const DefaultMinHold = 500 * time.Millisecond

// DefaultKeyPrefix is put before a job's name to make its lease key.
const DefaultKeyPrefix = "gocron:"

// Options configure a Locker or an Elector. The zero value gives the
// defaults.
type Options struct {
	// KeyPrefix is put before the job's name (the Locker) to make the
	// lease key. Default DefaultKeyPrefix.
	KeyPrefix string
	// Lease are the terms of each lease (nil fields inherit the client's
	// defaults). The Locker never waits (MaxWait is NoWait: a held key
	// means another instance runs the job) and sets MinHold to
	// DefaultMinHold when it is zero.
	Lease fenced.LeaseOptions
}

// Locker is a gocron.Locker on a fenced Client. It is safe for concurrent
// use.
type Locker struct {
	c      *fenced.Client
	prefix string
	opts   fenced.LeaseOptions
}

var _ gocron.Locker = (*Locker)(nil)

// NewLocker returns a Locker taking leases from c with opts (nil: the
// defaults). It returns an error matching fenced.ErrInvalidOptions or
// fenced.ErrNoFence when the lease terms cannot be used on c's backend.
func NewLocker(c *fenced.Client, opts *Options) (*Locker, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.KeyPrefix == "" {
		o.KeyPrefix = DefaultKeyPrefix
	}
	o.Lease.MaxWait = fenced.NoWait
	if o.Lease.MinHold == 0 {
		o.Lease.MinHold = DefaultMinHold
	}
	if _, err := c.Resolve(&o.Lease); err != nil {
		return nil, fmt.Errorf("fencedgocron: %w", err)
	}
	return &Locker{c: c, prefix: o.KeyPrefix, opts: o.Lease}, nil
}

// Lock takes the lease on the job named key, or fails (fenced.ErrHeld when
// another instance holds it), in which case gocron skips this run.
func (lk *Locker) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	l, err := lk.c.TryAcquire(ctx, lk.prefix+key, &lk.opts)
	if err != nil {
		return nil, err
	}
	return &Lock{lease: l, granted: time.Now()}, nil
}

// Lock is one run's lease. Its fence is Lease().Fence().
type Lock struct {
	lease   *fenced.Lease
	granted time.Time
	once    sync.Once
}

// Lease returns the lease behind the lock.
func (l *Lock) Lease() *fenced.Lease { return l.lease }

// Unlock releases the lease once its minimum hold has passed, in the
// background, and returns at once. ctx ending (gocron cancels it when the
// job is removed or the scheduler stops) cuts the hold short.
func (l *Lock) Unlock(ctx context.Context) error {
	l.once.Do(func() {
		go func() {
			l.lease.HoldAtLeast(ctx, l.granted)
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = l.lease.Release(rctx) // on failure the lease expires after its TTL
		}()
	})
	return nil
}

// ErrNotLeader is what Elector.IsLeader returns on an instance that does
// not lead.
var ErrNotLeader = errors.New("fencedgocron: this instance is not the leader")

// Elector is a gocron.Elector on a fenced Election: it campaigns in the
// background until its context ends, and IsLeader reports whether this
// instance leads now.
type Elector struct {
	mu   sync.Mutex
	lead *recipe.Leadership
	done chan struct{}
}

var _ gocron.Elector = (*Elector)(nil)

// NewElector campaigns for the election name on c until ctx ends (then it
// resigns). opts.Lease are the leadership's lease terms; KeyPrefix is not
// used (name is the key).
func NewElector(ctx context.Context, c *fenced.Client, name string, opts *Options) (*Elector, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	e, err := recipe.NewElection(c, name, &o.Lease)
	if err != nil {
		return nil, fmt.Errorf("fencedgocron: %w", err)
	}
	el := &Elector{done: make(chan struct{})}
	go el.campaign(ctx, e)
	return el, nil
}

func (el *Elector) campaign(ctx context.Context, e *recipe.Election) {
	defer close(el.done)
	for ctx.Err() == nil {
		ld, err := e.Campaign(ctx, "")
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			t := time.NewTimer(time.Second)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
			continue
		}
		el.mu.Lock()
		el.lead = ld
		el.mu.Unlock()
		select {
		case <-ld.Done():
		case <-ctx.Done():
		}
		el.mu.Lock()
		el.lead = nil
		el.mu.Unlock()
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = ld.Resign(rctx)
		cancel()
	}
}

// IsLeader returns nil while this instance leads, ErrNotLeader otherwise.
func (el *Elector) IsLeader(context.Context) error {
	el.mu.Lock()
	ld := el.lead
	el.mu.Unlock()
	if ld == nil || ld.Err() != nil {
		return ErrNotLeader
	}
	return nil
}

// Epoch returns the current term's epoch (its lease's fence, which strictly
// increases from term to term), or zero when this instance does not lead.
func (el *Elector) Epoch() uint64 {
	el.mu.Lock()
	defer el.mu.Unlock()
	if el.lead == nil {
		return 0
	}
	return el.lead.Epoch()
}

// Done is closed when the campaign has stopped (its context ended) and the
// last term was resigned.
func (el *Elector) Done() <-chan struct{} { return el.done }
