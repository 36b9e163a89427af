// Package fencedgocron plugs fenced into gocron v2
// (github.com/go-co-op/gocron/v2): a Locker, so that each run of a job
// happens on one scheduler instance only, under a lease the job can fence
// its writes with and that stops it when lost, and an Elector, so that one
// instance runs them all.
//
//	locker, err := fencedgocron.NewLocker(client, nil)
//	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
//	_, err = s.NewJob(gocron.DurationJob(time.Minute),
//		locker.Task(func(ctx context.Context, l *fenced.Lease) error {
//			// ctx ends when the lease is lost; send l.Fence() with every write.
//			return report(ctx, fence.From(l))
//		}),
//		gocron.WithName("report"))
//
// # The job's lease
//
// gocron calls the Locker before each run and passes the task the job's own
// context, the same at every run, which the Locker is also given. A task
// made with Locker.Task (or Elector.Task) runs its function with the lease
// of that run and a context that ends when the lease is lost, the job is
// removed or the scheduler shuts down. A lost lease cannot be noticed
// sooner than the store says so (a break, at the next renewal) or the
// lease's local validity ends (a pause past the TTL): another instance may
// then already run the job, so the function must send the lease's fence
// with its writes and let the resource refuse stale ones (package fence).
//
// A plain gocron.NewTask under the Locker runs once per tick across
// instances, but it is given no lease: it can neither be stopped when the
// lease is lost nor fenced, and a run that outlives its lease overlaps the
// next. Use it only for work where a duplicate run is harmless.
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
// A scheduler's Shutdown does not cut the hold short. After it, call
// Locker.Wait, which returns once the leases kept are released (MinHold
// after their grant, plus a round trip), then close the fenced Client. Closing it sooner
// releases them at once, and a late instance may run that tick again.
package fencedgocron

import (
	"errors"
	"time"

	"github.com/fenced-dev/fenced"
)

// DefaultMinHold is the Locker's minimum hold when Options.Lease.MinHold is
// zero. It is longer than the tick spread of instances on one network. It
// is shorter than gocron's shortest useful interval (a second).
const DefaultMinHold = 500 * time.Millisecond

// DefaultKeyPrefix is put before a job's name to make its lease key.
const DefaultKeyPrefix = "gocron:"

// Options configure a Locker or an Elector. The zero value gives the
// defaults.
type Options struct {
	// KeyPrefix is put before the job's name (the Locker) to make the
	// lease key. Default DefaultKeyPrefix.
	KeyPrefix string
	// Lease are the terms of each lease; zero fields take the defaults
	// documented on fenced.LeaseOptions. The Locker never waits (MaxWait
	// is zero: a held key means another instance runs the job) and sets
	// MinHold to DefaultMinHold when it is zero.
	Lease fenced.LeaseOptions
}

// errNilClient is returned by the constructors given a nil client.
var errNilClient = errors.New("fencedgocron: the *fenced.Client is nil: open one with fenced.Open")
