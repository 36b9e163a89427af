package fencedgocron_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/admin"
	"github.com/fenced-dev/fenced/fencedgocron"
	"github.com/fenced-dev/fenced/internal/testkit/childproc"
	"github.com/fenced-dev/fenced/internal/testkit/leasejob"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
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

// startLeaseJobs starts two leasejob schedulers, on a fresh SQLite store and
// resource, or on PostgreSQL for both when pg is set: a process stopped
// in a write keeps SQLite's write lock (fencedsqlite's availability
// caveat), which would stop the other schedulers too.
func startLeaseJobs(t *testing.T, pg bool) (store string, res *leasejob.Resource, procs []*testenv.Process, out string) {
	if pg {
		srv := testenv.StartPostgres(t)
		store, res = srv.URL(), leasejob.NewPostgresResource(t, srv.URL())
	} else {
		store, res = "sqlite://"+filepath.Join(t.TempDir(), "leases.db"), leasejob.NewResource(t)
	}
	out = filepath.Join(t.TempDir(), "runs")
	return store, res, childproc.Start(t, "leasejob", 2, store, out, res.Env()...), out
}

// TestLockerTaskBrokenMidJob (issue 36, item 11): a lease broken by an
// admin while a gocron job runs under it ends the job's context (cause
// ErrBroken), the job's late writes are refused by the guard, and the next
// run, under a newer fence, is the only one the resource takes from then
// on.
func TestLockerTaskBrokenMidJob(t *testing.T) {
	store, res, procs, out := startLeaseJobs(t, false)
	admc, err := fenced.Open(context.Background(), store, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer admc.Close()
	brk := func(t testing.TB, _ *testenv.Process, f uint64) {
		info, err := admin.Break(context.Background(), admc, fencedgocron.DefaultKeyPrefix+leasejob.Row, "test", "TestLockerTaskBrokenMidJob")
		if err != nil {
			t.Fatal(err)
		}
		if info.Fence != f {
			t.Fatalf("broke fence %d, want the running job's %d", info.Fence, f)
		}
	}
	leasejob.Judge(t, res, procs, out, leaseJobTTL, brk, "broken")
}

// TestLockerTaskStoppedMidJob (issue 36, item 11): on PostgreSQL, a
// scheduler SIGSTOPped past the TTL while its job runs: another scheduler
// runs the job under a newer fence; on SIGCONT the stopped job's context
// ends (its lease expired, or its renewal was refused) and its late
// writes are refused by the guard.
func TestLockerTaskStoppedMidJob(t *testing.T) {
	_, res, procs, out := startLeaseJobs(t, true)
	leasejob.Judge(t, res, procs, out, leaseJobTTL, leasejob.Stop(out, leaseJobTTL), "expired", "lost")
}
