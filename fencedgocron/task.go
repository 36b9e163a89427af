package fencedgocron

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/go-co-op/gocron/v2"

	"github.com/fenced-dev/fenced"
)

// ErrNoLock is what a task made with Locker.Task returns when its run was
// not locked by that Locker. The scheduler has another locker or an
// elector, or the job was given gocron.WithDisabledDistributedJobLocker.
// The function does not run.
var ErrNoLock = errors.New("fencedgocron: run not locked by the task's Locker: " +
	"pass it to gocron.WithDistributedLocker or WithDistributedJobLocker")

// ErrUnnamedJob is what the Locker's Lock returns for a job made with
// Locker.Task or Elector.Task but no name. gocron names such a job after
// the wrapper's function, the same for every job. The name is the lease
// key. The run is skipped.
var ErrUnnamedJob = errors.New("fencedgocron: the job has no name of its own: give it one with gocron.WithName; " +
	"it makes the job's lease key")

// wrapperNames are in gocron's default name of a job whose function Task
// made: the closure's name, whether or not Task was inlined into its
// caller (then the name starts with the caller's package).
var wrapperNames = []string{".(*Locker).Task.func", ".(*Elector).Task.func"}

// Task returns a gocron task that runs fn with this run's lease, the one
// the Locker took for it. fn's context ends when the lease is lost (its
// cause then matches fenced.ErrLost or fenced.ErrExpired), when the job is
// removed or when the scheduler shuts down. Send the lease's fence with
// every write (fence.From). A loss is known only when the store says so or
// the lease's local validity ends. By then another instance may run the
// job. The context is cancelled when fn returns, before the lease is
// released.
//
// Give the job a name with gocron.WithName: it makes the lease key
// (ErrUnnamedJob otherwise). The scheduler (WithDistributedLocker) or the
// job (WithDistributedJobLocker) must use this Locker, or fn does not run
// and the task returns ErrNoLock.
//
// The task returns fn's error. If the lease ended before fn returned, it
// returns a *fenced.LeaseEndedError, as fenced.Client.Do does: it matches
// the cause and fn's error. If the lease had ended before fn could start,
// fn does not run and the error matches the cause. gocron reports the
// error to the job's AfterJobRunsWithError listener.
func (lk *Locker) Task(fn func(ctx context.Context, l *fenced.Lease) error) gocron.Task {
	if fn == nil {
		return gocron.NewTask(nil) // NewJob refuses it
	}
	return gocron.NewTask(func(ctx context.Context) error {
		lock := lk.claim(ctx)
		if lock == nil {
			return ErrNoLock
		}
		defer lock.done()
		return runUnder(ctx, lock.lease, fn)
	})
}

// unnamed reports whether key is gocron's default name for a job whose
// function this package made.
func unnamed(key string) bool {
	for _, n := range wrapperNames {
		if strings.Contains(key, n) {
			return true
		}
	}
	return false
}

// runUnder runs fn with l and a context that ends when ctx or l ends, and
// is cancelled when fn returns.
func runUnder(ctx context.Context, l *fenced.Lease, fn func(context.Context, *fenced.Lease) error) error {
	if err := l.Err(); err != nil {
		return fmt.Errorf("fencedgocron: %s ended before the job started: %w", l, err)
	}
	runCtx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(l.Context(), func() { cancel(context.Cause(l.Context())) })
	err := fn(runCtx, l)
	stop()
	lost := l.Err() // nil unless the lease ended before fn returned
	cancel(fenced.ErrReleased)
	if lost != nil {
		return fmt.Errorf("fenced: do %q: %w", l.Key(), &fenced.LeaseEndedError{Fence: l.Fence(), Cause: lost, WorkErr: err})
	}
	return err
}
