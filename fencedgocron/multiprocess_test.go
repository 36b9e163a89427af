package fencedgocron_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fencedgocron"
	_ "github.com/fenced-dev/fenced/fencedpostgres"
	_ "github.com/fenced-dev/fenced/fencedsqlite"
	"github.com/fenced-dev/fenced/internal/testkit/childproc"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

func TestMain(m *testing.M) {
	childproc.Main(m, map[string]func() int{"scheduler": childScheduler, "leasejob": childLeaseJob})
}

// childScheduler runs a gocron scheduler with the fenced Locker on the
// parent's store and a job due at every second, which appends "run PID
// UNIXNANO" to the parent's output, for $RUN_FOR. It appends "start PID
// UNIXNANO" once started and "stop PID UNIXNANO" as it shuts down. Then it
// appends "delays L T": the longest Lock (a grant or a refusal) and the
// worst timer lateness it saw, in nanoseconds.
func childScheduler() int {
	runFor, err := time.ParseDuration(os.Getenv("RUN_FOR"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	minHold, err := time.ParseDuration(os.Getenv("MIN_HOLD"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	client, err := childproc.Store(context.Background())
	if err != nil {
		return childproc.Fail(err)
	}
	defer client.Close()
	locker, err := fencedgocron.NewLocker(client, &fencedgocron.Options{Lease: fenced.LeaseOptions{TTL: 10 * time.Second, MinHold: minHold}})
	if err != nil {
		return childproc.Fail(err)
	}
	out, err := childproc.Output()
	if err != nil {
		return childproc.Fail(err)
	}
	defer out.Close()
	late := testenv.SampleLateness()
	defer late.Stop()
	timed := &timedLocker{Locker: locker}
	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(timed))
	if err != nil {
		return childproc.Fail(err)
	}
	pid := os.Getpid()
	_, err = s.NewJob(gocron.CronJob("* * * * * *", true), gocron.NewTask(func() {
		fmt.Fprintf(out, "run %d %d\n", pid, time.Now().UnixNano())
	}), gocron.WithName("every-second"))
	if err != nil {
		return childproc.Fail(err)
	}
	s.Start()
	fmt.Fprintf(out, "start %d %d\n", pid, time.Now().UnixNano())
	time.Sleep(runFor)
	fmt.Fprintf(out, "stop %d %d\n", pid, time.Now().UnixNano())
	if err := s.Shutdown(); err != nil {
		return childproc.Fail(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := locker.Wait(ctx); err != nil {
		return childproc.Fail(err)
	}
	timed.mu.Lock()
	defer timed.mu.Unlock()
	fmt.Fprintf(out, "delays %d %d\n", timed.worst, late.Max())
	return 0
}

// timedLocker measures how long each Lock of the Locker under it takes.
type timedLocker struct {
	gocron.Locker
	mu    sync.Mutex
	worst time.Duration
}

func (l *timedLocker) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	at := time.Now()
	lk, err := l.Locker.Lock(ctx, key)
	l.mu.Lock()
	l.worst = max(l.worst, time.Since(at))
	l.mu.Unlock()
	return lk, err
}

// schedDelays are the worst delays the scheduler processes saw.
type schedDelays struct {
	lock, late time.Duration // the longest Lock; the worst timer lateness
}

// schedRun is one run of the job: the scheduler process that ran it, and
// when.
type schedRun struct {
	pid string
	at  time.Time
}

// runSchedulers starts three scheduler processes on store for runFor and
// returns the runs of each second, across them all, and the worst delays
// they saw. It logs when each scheduler started and stopped.
func runSchedulers(t *testing.T, store string, minHold, runFor time.Duration) (map[int64][]schedRun, schedDelays) {
	out := filepath.Join(t.TempDir(), "runs")
	procs := childproc.Start(t, "scheduler", 3, store, out, "RUN_FOR="+runFor.String(), "MIN_HOLD="+minHold.String())
	deadline := time.After(runFor + 30*time.Second)
	for _, p := range procs {
		select {
		case <-p.Exited():
		case <-deadline:
			t.Fatalf("%s has not exited:\n%s", p.Name, p.Log.String())
		}
		if !p.Cmd.ProcessState.Success() {
			t.Fatalf("%s: %v\n%s", p.Name, p.Cmd.ProcessState, p.Log.String())
		}
	}
	lines := childproc.Lines(t, out)
	runs := map[int64][]schedRun{}
	pids := map[string]bool{}
	var d schedDelays
	for _, f := range lines {
		if len(f) == 3 && f[0] == "delays" {
			lock, err1 := strconv.ParseInt(f[1], 10, 64)
			late, err2 := strconv.ParseInt(f[2], 10, 64)
			if err1 != nil || err2 != nil {
				t.Fatalf("bad line %q", f)
			}
			d.lock, d.late = max(d.lock, time.Duration(lock)), max(d.late, time.Duration(late))
			continue
		}
		if len(f) != 3 {
			t.Fatalf("bad line %q", f)
		}
		ns, err := strconv.ParseInt(f[2], 10, 64)
		if err != nil {
			t.Fatalf("bad line %q", f)
		}
		at := time.Unix(0, ns)
		switch f[0] {
		case "run":
			runs[at.Unix()] = append(runs[at.Unix()], schedRun{pid: f[1], at: at})
			pids[f[1]] = true
		case "start", "stop":
			t.Logf("scheduler %s: %s at %s", f[1], f[0], at.Format("15:04:05.000"))
		default:
			t.Fatalf("bad line %q", f)
		}
	}
	n := 0
	for _, r := range runs {
		n += len(r)
	}
	t.Logf("%d runs in %d seconds, by %d processes; longest Lock %v, worst timer lateness %v", n, len(runs), len(pids),
		d.lock.Round(time.Millisecond), d.late.Round(time.Millisecond))
	return runs, d
}

// checkOncePerTick fails unless each second ran the job exactly once and
// (nearly) every second of the run had its run, as often as the machine
// allows: a run holds the key for minHold after a Lock that took up to
// d.lock, its release (a write like the grant) takes as long, and the
// next tick fires up to d.late late, so the next run comes at most every
// ⌈(2·d.lock + minHold + d.late) / 1 s⌉ seconds: every second on a quiet
// machine, where all but 2 of the run's seconds must have a run.
func checkOncePerTick(t *testing.T, runs map[int64][]schedRun, runFor, minHold time.Duration, d schedDelays) {
	t.Helper()
	var secs []int64
	for s := range runs {
		secs = append(secs, s)
	}
	sort.Slice(secs, func(i, j int) bool { return secs[i] < secs[j] })
	for _, s := range secs {
		if len(runs[s]) != 1 {
			var who []string
			for _, r := range runs[s] {
				who = append(who, fmt.Sprintf("%s at %s", r.pid, r.at.Format("15:04:05.000")))
			}
			t.Errorf("second %d: %d runs across the schedulers, want 1: %v", s, len(runs[s]), who)
		}
	}
	every := max(1, int((2*d.lock+minHold+d.late+time.Second-1)/time.Second))
	if want := (int(runFor/time.Second) - 2) / every; len(secs) < want {
		t.Errorf("only %d seconds had a run in %v, want at least %d (a run every %d s at most: longest Lock %v, worst timer lateness %v)",
			len(secs), runFor, want, every, d.lock.Round(time.Millisecond), d.late.Round(time.Millisecond))
	}
}

// TestThreeSchedulersRunEachTickOnce (go-co-op/gocron#841): three gocron
// schedulers with the fenced Locker, on SQLite and on PostgreSQL, run a
// job due every second once per second across all of them, although each
// run is far shorter than the spread of their ticks.
func TestThreeSchedulersRunEachTickOnce(t *testing.T) {
	const runFor = 6 * time.Second
	t.Run("SQLite", func(t *testing.T) {
		t.Parallel()
		store := "sqlite://" + filepath.Join(t.TempDir(), "leases.db")
		runs, d := runSchedulers(t, store, fencedgocron.DefaultMinHold, runFor)
		checkOncePerTick(t, runs, runFor, fencedgocron.DefaultMinHold, d)
	})
	t.Run("PostgreSQL", func(t *testing.T) {
		t.Parallel()
		pg := testenv.StartPostgres(t)
		runs, d := runSchedulers(t, pg.URL(), fencedgocron.DefaultMinHold, runFor)
		checkOncePerTick(t, runs, runFor, fencedgocron.DefaultMinHold, d)
	})
}
