package fencedcron_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fencedcron"
	_ "github.com/fenced-dev/fenced/fencedpostgres"
	"github.com/fenced-dev/fenced/internal/testkit/childproc"
	"github.com/fenced-dev/fenced/internal/testkit/leasejob"
)

// leaseJobTTL is the lease TTL of the leasejob children.
const leaseJobTTL = 2 * time.Second

// childLeaseJob runs a cron with SkipIfHeld and a LeaseFunc job due every
// second that runs leasejob.Work with its lease, until the parent kills it.
func childLeaseJob() int {
	client, err := childproc.Store(context.Background())
	if err != nil {
		return childproc.Fail(err)
	}
	defer client.Close()
	guard, err := leasejob.Guard()
	if err != nil {
		return childproc.Fail(err)
	}
	out, err := childproc.Output()
	if err != nil {
		return childproc.Fail(err)
	}
	defer out.Close()
	skip, err := fencedcron.SkipIfHeld(client, leasejob.Row, &fencedcron.Options{Lease: fenced.LeaseOptions{TTL: leaseJobTTL}})
	if err != nil {
		return childproc.Fail(err)
	}
	c := cron.New(cron.WithSeconds(), cron.WithChain(cron.Recover(cron.DefaultLogger), skip))
	if _, err := c.AddJob("* * * * * *", fencedcron.LeaseFunc(func(ctx context.Context, l *fenced.Lease) error {
		return leasejob.Work(ctx, l, guard, out)
	})); err != nil {
		return childproc.Fail(err)
	}
	c.Start()
	select {} // until the parent kills it
}

// TestLeaseFuncBrokenMidJob (issue 36, item 11): a lease broken by an admin
// while a robfig/cron LeaseFunc job runs under it ends the job's context
// (cause ErrBroken), the job's late writes are refused by the guard, and
// the next run, under a newer fence, is the only one the resource takes
// from then on.
func TestLeaseFuncBrokenMidJob(t *testing.T) {
	store, res, procs, out := leasejob.Start(t, false)
	leasejob.Judge(t, res, procs, out, leaseJobTTL, leasejob.Break(t, store, leasejob.Row), "broken")
}

// TestLeaseFuncStoppedMidJob (issue 36, item 11): on PostgreSQL, a cron
// process SIGSTOPped past the TTL while its LeaseFunc job runs: another
// cron runs the job under a newer fence; on SIGCONT the stopped job's
// context ends and its late writes are refused by the guard.
func TestLeaseFuncStoppedMidJob(t *testing.T) {
	if testing.Short() {
		t.Skip("long: SIGSTOP of a cron process past the TTL; run without -short")
	}
	_, res, procs, out := leasejob.Start(t, true)
	leasejob.Judge(t, res, procs, out, leaseJobTTL, leasejob.Stop(out, leaseJobTTL), "expired", "lost")
}

// TestSkipIfHeldRefusesBadInput (issue 43): a nil client, a bad key and
// lease terms the backend refuses are errors naming what is wrong when
// the wrapper is made, not a panic or a silent skip at every tick.
func TestSkipIfHeldRefusesBadInput(t *testing.T) {
	c, err := fenced.Open(context.Background(), "sqlite://"+filepath.Join(t.TempDir(), "leases.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, tc := range []struct {
		name string
		c    *fenced.Client
		key  string
		opts *fencedcron.Options
		want error
		says string
	}{
		{"nil client", nil, "report", nil, nil, "*fenced.Client is nil"},
		{"empty key", c, "", nil, fenced.ErrInvalidKey, "key"},
		{"MinHold past MaxHold", c, "report", &fencedcron.Options{Lease: fenced.LeaseOptions{MinHold: time.Minute, MaxHold: time.Second}}, fenced.ErrInvalidOptions, "MinHold"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, err := fencedcron.SkipIfHeld(tc.c, tc.key, tc.opts)
			if err == nil || w != nil {
				t.Fatalf("SkipIfHeld: %v, %v; want an error", w != nil, err)
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Errorf("error %v, want one matching %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.says) {
				t.Errorf("error %q does not say %q", err, tc.says)
			}
		})
	}
}

// TestLeaseFuncOutsideSkipIfHeldSaysSo: a LeaseFunc that another wrapper
// separates from SkipIfHeld cannot get its lease; it panics with a message
// that says where SkipIfHeld belongs, which cron.Recover logs.
func TestLeaseFuncOutsideSkipIfHeldSaysSo(t *testing.T) {
	defer func() {
		r := recover()
		if s, _ := r.(string); !strings.Contains(s, "last in the chain") {
			t.Fatalf("recovered %v, want the message naming the chain order", r)
		}
	}()
	fencedcron.LeaseFunc(func(context.Context, *fenced.Lease) error { return nil }).Run()
}
