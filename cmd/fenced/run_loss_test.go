package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// Tests of how `fenced run` ends after a loss: with --min-hold, with a
// dead store, and with a signal that comes as the grant lands. They run in
// the supervision mode this machine allows (the cgroup), logged with -v.

// A break while COMMAND runs, not noticed before it ends (the next renewal
// is 10 s away), must not be hidden by --min-hold: fenced checks the grant
// when the work ends, before holding on, and exits 77 at once.
func TestRunMinHoldLossIs77(t *testing.T) {
	store := tempStore(t)
	goFile := filepath.Join(t.TempDir(), "go")
	cmd, _, errb := startRun(t, store, "-v", "run", "--ttl", "30s", "--min-hold", "1m", "job:mh", "--",
		"sh", "-c", "while [ ! -e "+goFile+" ]; do sleep 0.01; done; exit 0")
	checkMode(t, errb, "")
	adm := client(t, store)
	waitHeld(t, adm, "job:mh")
	if _, err := adm.Break(context.Background(), "job:mh", "test", "test"); err != nil {
		t.Fatal(err)
	}
	l, err := adm.TryAcquire(context.Background(), "job:mh", &fenced.LeaseOptions{TTL: time.Minute})
	if err != nil || l.Fence() != 2 {
		t.Fatalf("second holder: %v; want fence 2 while COMMAND still runs", err)
	}
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if code := waitExit(t, cmd, 30*time.Second); code != 77 {
		t.Fatalf("exit %d after a second holder ran with fence 2 while COMMAND ran, want 77; stderr %s", code, errb)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("fenced took %v to report the loss", took)
	}
	if s := errb.String(); !strings.Contains(s, "(exit 77)") || strings.Contains(s, "had ended") {
		t.Fatalf("stderr does not tell the loss as it was: %s", s)
	}
}

// A signal that comes as the grant lands (the wait has succeeded, the
// signal was taken by the waiter) must not be swallowed: the lease is
// released and nothing runs.
func TestSignalAsGrantLandsRunsNothing(t *testing.T) {
	store := tempStore(t)
	c := client(t, store)
	sigs := make(chan os.Signal, 1)
	ran := false
	h, err := acquireOrInterrupt(context.Background(), sigs, "job:sig", func(acqCtx context.Context) (*hold, error) {
		l, err := c.TryAcquire(context.Background(), "job:sig", nil)
		if err != nil {
			return nil, err
		}
		sigs <- syscall.SIGTERM
		<-acqCtx.Done() // the waiter took the signal after the grant landed
		return &hold{lease: leaseHold{l}, leases: []*fenced.Lease{l}, desc: "the lease on job:sig"}, nil
	})
	if err == nil {
		ran = true
		h.lease.Release(context.Background())
	}
	if ran || !strings.Contains(err.Error(), "terminated") {
		t.Fatalf("SIGTERM as the grant landed: err %v; want an error naming the signal, and nothing run", err)
	}
	if l, _ := c.List(context.Background(), ""); len(l) != 0 {
		t.Fatalf("the lease was kept: %+v", l)
	}
}

// deadStore starts a Redis server for a test and returns its URL and a
// function that freezes it (SIGSTOP): a store that accepts nothing and
// answers nothing, until the test ends.
func deadStore(t *testing.T) (string, func()) {
	r := testenv.StartRedis(t, testenv.RedisConfig{})
	return r.URL(), func() {
		if err := r.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Signal(syscall.SIGCONT) })
	}
}

// After a lease is lost to a dead store, fenced exits 77 as soon as the
// tree is gone, without spending seconds trying to release a lease it no
// longer has; with --min-hold, the hold ends with the lease.
func TestRunExitsAtOnceAfterLossToDeadStore(t *testing.T) {
	if testing.Short() {
		t.Skip("long: kills the store and waits out a TTL; run without -short")
	}
	const ttl = 2 * time.Second
	t.Run("running", func(t *testing.T) {
		store, kill := deadStore(t)
		cmd, _, errb := startRun(t, store, "-v", "run", "--min-fence", "repeatable", "--ttl", ttl.String(), "--grace", "200ms", "job:dead", "--", "sleep", "30")
		checkMode(t, errb, "")
		waitHeld(t, client(t, store), "job:dead")
		kill()
		start := time.Now()
		if code := waitExit(t, cmd, 20*time.Second); code != 77 {
			t.Fatalf("exit %d, want 77; stderr %s", code, errb)
		}
		if took := time.Since(start); took > ttl+1500*time.Millisecond {
			t.Fatalf("fenced exited %v after the store died (--ttl %v, --grace 200ms); stderr %s", took, ttl, errb)
		}
	})
	t.Run("min-hold", func(t *testing.T) {
		store, kill := deadStore(t)
		cmd, _, errb := startRun(t, store, "-v", "run", "--min-fence", "repeatable", "--ttl", ttl.String(), "--min-hold", "1m", "job:dead", "--", "true")
		checkMode(t, errb, "")
		eventually(t, 20*time.Second, "the hold did not begin", func() bool { return strings.Contains(errb.String(), "keeping") })
		kill()
		start := time.Now()
		if code := waitExit(t, cmd, 70*time.Second); code != 0 {
			t.Fatalf("exit %d, want COMMAND's 0 (its work was confirmed before the hold); stderr %s", code, errb)
		}
		if took := time.Since(start); took > ttl+1500*time.Millisecond {
			t.Fatalf("fenced exited %v after the store died, with the hold lost after at most --ttl %v; stderr %s", took, ttl, errb)
		}
	})
}

// The error of a release that could not reach the store is printed once
// with the "fenced: " prefix, not twice.
func TestRunReleaseErrorPrefixOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("long: kills the store and waits out the release; run without -short")
	}
	store, kill := deadStore(t)
	goFile := filepath.Join(t.TempDir(), "go")
	cmd, _, errb := startRun(t, store, "-v", "run", "--min-fence", "repeatable", "--ttl", "30s", "job:prefix", "--",
		"sh", "-c", "while [ ! -e "+goFile+" ]; do sleep 0.01; done; exit 0")
	checkMode(t, errb, "")
	waitHeld(t, client(t, store), "job:prefix")
	kill()
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code := waitExit(t, cmd, 30*time.Second); code != 0 {
		t.Fatalf("exit %d, want 0 (valid by the local clock when COMMAND ended); stderr %s", code, errb)
	}
	if s := errb.String(); strings.Contains(s, "fenced: fenced:") || !strings.Contains(s, "fenced: release") {
		t.Fatalf("stderr: %s; want the release error once prefixed", s)
	}
}
