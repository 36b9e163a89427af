package fencedgocron_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fencedgocron"
)

func openSQLite(t *testing.T) *fenced.Client {
	t.Helper()
	c, err := fenced.Open(context.Background(), "sqlite://"+filepath.Join(t.TempDir(), "leases.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestNilClientIsAnError (issue 43): a nil client to NewLocker or
// NewElector is an error that says so, not a panic.
func TestNilClientIsAnError(t *testing.T) {
	if _, err := fencedgocron.NewLocker(nil, nil); err == nil || !strings.Contains(err.Error(), "*fenced.Client is nil") {
		t.Errorf("NewLocker(nil): %v, want the nil client named", err)
	}
	if _, err := fencedgocron.NewElector(context.Background(), nil, "jobs", nil); err == nil || !strings.Contains(err.Error(), "*fenced.Client is nil") {
		t.Errorf("NewElector(nil): %v, want the nil client named", err)
	}
}

// runOnce runs one job once at once on a new scheduler with opts and
// returns the error its run reported: the task's, or the locker's.
func runOnce(t *testing.T, task gocron.Task, sopts []gocron.SchedulerOption, jopts ...gocron.JobOption) error {
	t.Helper()
	s, err := gocron.NewScheduler(sopts...)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	var once sync.Once
	got := make(chan error, 1)
	report := func(_ uuid.UUID, _ string, err error) { once.Do(func() { got <- err }) }
	jopts = append(jopts,
		gocron.WithEventListeners(
			gocron.AfterJobRunsWithError(report),
			gocron.AfterLockError(report),
			gocron.AfterJobRuns(func(uuid.UUID, string) { once.Do(func() { got <- nil }) }),
		))
	if _, err := s.NewJob(gocron.OneTimeJob(gocron.OneTimeJobStartImmediately()), task, jopts...); err != nil {
		t.Fatal(err)
	}
	s.Start()
	select {
	case err := <-got:
		return err
	case <-time.After(30 * time.Second): // liveness only
		t.Fatal("the job did not run")
		return nil
	}
}

// TestLockerTaskNeedsItsLocker: a task made with Locker.Task on a scheduler
// that does not use that Locker does not run its function and says why;
// one with no name of its own is skipped with ErrUnnamedJob (its default
// name, the wrapper's, would be every such job's lease key); with both, it
// runs under the lease "gocron:" + its name.
func TestLockerTaskNeedsItsLocker(t *testing.T) {
	locker, err := fencedgocron.NewLocker(openSQLite(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	var ran []string
	task := locker.Task(func(_ context.Context, l *fenced.Lease) error {
		ran = append(ran, l.Key())
		return nil
	})
	if err := runOnce(t, task, nil, gocron.WithName("report")); !errors.Is(err, fencedgocron.ErrNoLock) {
		t.Errorf("without the Locker: %v, want ErrNoLock", err)
	}
	if err := runOnce(t, task, []gocron.SchedulerOption{gocron.WithDistributedLocker(locker)}); !errors.Is(err, fencedgocron.ErrUnnamedJob) {
		t.Errorf("without a name: %v, want ErrUnnamedJob", err)
	}
	if len(ran) != 0 {
		t.Fatalf("the function ran as %v", ran)
	}
	if err := runOnce(t, task, []gocron.SchedulerOption{gocron.WithDistributedLocker(locker)}, gocron.WithName("report")); err != nil {
		t.Fatal(err)
	}
	if len(ran) != 1 || ran[0] != "gocron:report" {
		t.Fatalf("ran %v, want once under gocron:report", ran)
	}
}

// TestLockerTaskLeaseEndsWithTheRun: the task's context is cancelled when
// its function returns, the lease is released after the minimum hold, and
// a lease lost during the run is reported as a *fenced.LeaseEndedError
// carrying the function's error.
func TestLockerTaskLeaseEndsWithTheRun(t *testing.T) {
	c := openSQLite(t)
	locker, err := fencedgocron.NewLocker(c, &fencedgocron.Options{Lease: fenced.LeaseOptions{MinHold: time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	sopts := []gocron.SchedulerOption{gocron.WithDistributedLocker(locker)}
	var (
		runCtx context.Context
		lease  *fenced.Lease
	)
	err = runOnce(t, locker.Task(func(ctx context.Context, l *fenced.Lease) error {
		runCtx, lease = ctx, l
		return nil
	}), sopts, gocron.WithName("a"))
	if err != nil {
		t.Fatal(err)
	}
	if runCtx.Err() == nil {
		t.Error("the run's context is live after the run")
	}
	select {
	case <-lease.Context().Done():
	case <-time.After(30 * time.Second): // liveness only
		t.Fatal("the lease was not released after the run")
	}
	workErr := errors.New("work failed")
	err = runOnce(t, locker.Task(func(ctx context.Context, l *fenced.Lease) error {
		if err := l.Release(context.Background()); err != nil {
			return err
		}
		<-ctx.Done()
		return workErr
	}), sopts, gocron.WithName("b"))
	var ended *fenced.LeaseEndedError
	if !errors.As(err, &ended) || !errors.Is(err, fenced.ErrReleased) || !errors.Is(err, workErr) {
		t.Fatalf("lease ended in the run: %v, want a LeaseEndedError with ErrReleased and the work's error", err)
	}
}
