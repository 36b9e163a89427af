// Package fencedcron runs robfig/cron/v3 (github.com/robfig/cron/v3) jobs
// under fenced leases, so that each run happens on one instance only:
//
//	c := cron.New(cron.WithChain(fencedcron.SkipIfHeld(client, "report", nil)))
//
// A run whose key another instance holds is skipped. Each lease is kept
// until its MinHold after the grant (default DefaultMinHold),
// so a job shorter than the instances' tick spread is not run twice; see
// docs/gocron.md.
package fencedcron

import (
	"context"
	"errors"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/fenced-dev/fenced"
)

// DefaultMinHold is a lease's minimum hold when Options.Lease.MinHold is
// zero, the same as fencedgocron's: longer than the tick spread of
// instances on one network, shorter than the shortest useful interval (a
// second).
const DefaultMinHold = 500 * time.Millisecond

// Options configure SkipIfHeld. The zero value gives the defaults.
type Options struct {
	// Lease are the terms of each run's lease. MaxWait is NoWait (a held
	// key means another instance runs the job); a zero MinHold is
	// DefaultMinHold.
	Lease fenced.LeaseOptions
	// OnError, when set, is called with every error but fenced.ErrHeld
	// (a skipped run): the store unavailable, the lease lost during the
	// run. Default: ignored.
	OnError func(error)
}

// SkipIfHeld returns a cron.JobWrapper that runs each job under a lease on
// key from c, and skips the run when the key is held elsewhere. Give each
// job its own key (wrap it with cron.NewChain(SkipIfHeld(...)).Then(job)
// when one cron runs several).
func SkipIfHeld(c *fenced.Client, key string, opts *Options) cron.JobWrapper {
	var o Options
	if opts != nil {
		o = *opts
	}
	o.Lease.MaxWait = fenced.NoWait
	if o.Lease.MinHold == 0 {
		o.Lease.MinHold = DefaultMinHold
	}
	return func(j cron.Job) cron.Job {
		return cron.FuncJob(func() {
			err := c.Do(context.Background(), key, &o.Lease, func(context.Context, *fenced.Lease) error {
				j.Run()
				return nil
			})
			if err != nil && !errors.Is(err, fenced.ErrHeld) && o.OnError != nil {
				o.OnError(err)
			}
		})
	}
}
