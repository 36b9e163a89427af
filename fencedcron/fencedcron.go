// Package fencedcron runs robfig/cron/v3 (github.com/robfig/cron/v3) jobs
// under fenced leases, so that each run happens on one instance only, and a
// LeaseFunc job gets its run's lease to fence its writes with and a context
// that ends when the lease is lost:
//
//	skip, err := fencedcron.SkipIfHeld(client, "report", nil)
//	c := cron.New(cron.WithChain(skip))
//	c.AddJob("@every 1m", fencedcron.LeaseFunc(func(ctx context.Context, l *fenced.Lease) error {
//		// ctx ends when the lease is lost; send l.Fence() with every write.
//		return report(ctx, fence.From(l))
//	}))
//
// A run whose key another instance holds is skipped. Each lease is kept
// until its MinHold after the grant (default DefaultMinHold), so a job
// shorter than the instances' tick spread is not run twice; see
// docs/gocron.md.
//
// A plain job (cron.FuncJob) under SkipIfHeld also runs once per tick
// across instances, but it is given no lease: it can neither be stopped
// when the lease is lost nor fenced, and a run that outlives its lease
// overlaps the next. Use it only for work where a duplicate run is
// harmless.
package fencedcron

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/fenced-dev/fenced"
)

// DefaultMinHold is a lease's minimum hold when Options.Lease.MinHold is
// zero, the same as fencedgocron's. It is longer than the tick spread of
// instances on one network. It is shorter than the shortest useful interval
// (a second).
const DefaultMinHold = 500 * time.Millisecond

// Options configure SkipIfHeld. The zero value gives the defaults.
type Options struct {
	// Lease are the terms of each run's lease; zero fields take the
	// defaults documented on fenced.LeaseOptions. MaxWait is zero (a
	// held key means another instance runs the job); a zero MinHold is
	// DefaultMinHold.
	Lease fenced.LeaseOptions
	// OnError, when set, is called with every error but fenced.ErrHeld
	// (a skipped run): the store unavailable, a LeaseFunc's error, the
	// lease lost during the run (a *fenced.LeaseEndedError, as
	// fenced.Client.Do returns). Default: ignored.
	OnError func(error)
}

// LeaseFunc is a job that runs with its run's lease. Its context ends when
// the lease is lost (its cause then matches fenced.ErrLost or
// fenced.ErrExpired) or the client is closed. Send the lease's fence with
// every write (fence.From). A loss is known only when the store says so or
// the lease's local validity ends. By then another instance may run the
// job. The context is cancelled when the function returns, before the lease
// is released. Its error goes to Options.OnError.
//
// SkipIfHeld gives it the lease only when it wraps the LeaseFunc itself:
// put SkipIfHeld last in the chain, nearest the job
// (cron.WithChain(cron.Recover(logger), skip)).
type LeaseFunc func(ctx context.Context, l *fenced.Lease) error

// Run panics: a LeaseFunc runs only under SkipIfHeld, which calls the
// function with its lease. It is here because cron.Job needs it; it is
// reached only when another wrapper stands between SkipIfHeld and the job,
// and the panic says so.
func (f LeaseFunc) Run() {
	panic("fencedcron: a LeaseFunc ran without its lease: put fencedcron.SkipIfHeld last in the chain, nearest the job")
}

// SkipIfHeld returns a cron.JobWrapper that runs each job under a lease on
// key from c, and skips the run when the key is held elsewhere. A LeaseFunc
// job is called with the lease; any other job's Run is called under it.
// Give each job its own key (wrap it with cron.NewChain(wrapper).Then(job)
// when one cron runs several).
//
// It returns an error when c is nil or key is not a valid key (matching
// fenced.ErrInvalidKey). It also does when the lease terms cannot be used
// on c's backend (matching fenced.ErrInvalidOptions or fenced.ErrNoFence).
func SkipIfHeld(c *fenced.Client, key string, opts *Options) (cron.JobWrapper, error) {
	if c == nil {
		return nil, errors.New("fencedcron: the *fenced.Client is nil: open one with fenced.Open")
	}
	if err := fenced.ValidateKey(key); err != nil {
		return nil, fmt.Errorf("fencedcron: %w", err)
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	o.Lease.MaxWait = 0
	if o.Lease.MinHold == 0 {
		o.Lease.MinHold = DefaultMinHold
	}
	if _, err := c.Resolve(&o.Lease); err != nil {
		return nil, fmt.Errorf("fencedcron: job %q: %w", key, err)
	}
	return func(j cron.Job) cron.Job {
		fn, leased := j.(LeaseFunc)
		switch {
		case leased && fn == nil:
			fn = func(context.Context, *fenced.Lease) error { return errors.New("the LeaseFunc is nil") }
		case !leased:
			fn = func(context.Context, *fenced.Lease) error {
				j.Run()
				return nil
			}
		}
		return cron.FuncJob(func() {
			err := c.Do(context.Background(), key, &o.Lease, fn)
			if err != nil && !errors.Is(err, fenced.ErrHeld) && o.OnError != nil {
				o.OnError(fmt.Errorf("fencedcron: job %q: %w", key, err))
			}
		})
	}, nil
}
