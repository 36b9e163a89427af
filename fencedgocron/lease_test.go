package fencedgocron_test

import (
	"context"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fencedgocron"
	"github.com/fenced-dev/fenced/internal/testkit/childproc"
	"github.com/fenced-dev/fenced/internal/testkit/leasejob"
)

// leaseJobTTL is the lease TTL of the leasejob children.
const leaseJobTTL = 2 * time.Second

// childLeaseJob runs a gocron scheduler with the fenced Locker and a job
// due every 200 ms, made with Locker.Task, that runs leasejob.Work with its
// lease until the parent kills it.
func childLeaseJob() int {
	client, err := childproc.Store(context.Background())
	if err != nil {
		return childproc.Fail(err)
	}
	defer client.Close()
	locker, err := fencedgocron.NewLocker(client, &fencedgocron.Options{Lease: fenced.LeaseOptions{TTL: leaseJobTTL}})
	if err != nil {
		return childproc.Fail(err)
	}
	guard, err := leasejob.Guard()
	if err != nil {
		return childproc.Fail(err)
	}
	out, err := childproc.Output()
	if err != nil {
		return childproc.Fail(err)
	}
	defer out.Close()
	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
	if err != nil {
		return childproc.Fail(err)
	}
	_, err = s.NewJob(gocron.DurationJob(200*time.Millisecond), locker.Task(func(ctx context.Context, l *fenced.Lease) error {
		return leasejob.Work(ctx, l, guard, out)
	}), gocron.WithName(leasejob.Row))
	if err != nil {
		return childproc.Fail(err)
	}
	s.Start()
	select {} // until the parent kills it
}

// TestLockerTaskBrokenMidJob (issue 36, item 11): a lease broken by an
// admin while a gocron job runs under it ends the job's context (cause
// ErrBroken), the job's late writes are refused by the guard, and the next
// run, under a newer fence, is the only one the resource takes from then
// on.
func TestLockerTaskBrokenMidJob(t *testing.T) {
	store, res, procs, out := leasejob.Start(t, false)
	leasejob.Judge(t, res, procs, out, leaseJobTTL, leasejob.Break(t, store, fencedgocron.DefaultKeyPrefix+leasejob.Row), "broken")
}

// TestLockerTaskStoppedMidJob (issue 36, item 11): on PostgreSQL, a
// scheduler SIGSTOPped past the TTL while its job runs: another scheduler
// runs the job under a newer fence; on SIGCONT the stopped job's context
// ends (its lease expired, or its renewal was refused) and its late
// writes are refused by the guard.
func TestLockerTaskStoppedMidJob(t *testing.T) {
	if testing.Short() {
		t.Skip("long: SIGSTOP of a scheduler process past the TTL; run without -short")
	}
	_, res, procs, out := leasejob.Start(t, true)
	leasejob.Judge(t, res, procs, out, leaseJobTTL, leasejob.Stop(out, leaseJobTTL), "expired", "lost")
}
