package fencedgocron_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fencedgocron"
	_ "github.com/fenced-dev/fenced/fencedpostgres"
	_ "github.com/fenced-dev/fenced/fencedsqlite"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

const childEnv = "FENCEDGOCRON_TEST_CHILD"

func TestMain(m *testing.M) {
	switch os.Getenv(childEnv) {
	case "":
		os.Exit(m.Run())
	case "scheduler":
		os.Exit(childScheduler())
	}
	fmt.Fprintln(os.Stderr, "unknown child mode")
	os.Exit(2)
}

// childScheduler runs a gocron scheduler with the fenced Locker on
// $STORE and a job due at every second, which appends "pid second" to
// $OUT, for $RUN_FOR.
func childScheduler() int {
	ctx := context.Background()
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
	client, err := fenced.Open(ctx, os.Getenv("STORE"), nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer client.Close()
	locker, err := fencedgocron.NewLocker(client, &fencedgocron.Options{Lease: fenced.LeaseOptions{TTL: 10 * time.Second, MinHold: minHold}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	out, err := os.OpenFile(os.Getenv("OUT"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer out.Close()
	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	pid := os.Getpid()
	_, err = s.NewJob(gocron.CronJob("* * * * * *", true), gocron.NewTask(func() {
		fmt.Fprintf(out, "%d %d\n", pid, time.Now().Unix())
	}), gocron.WithName("every-second"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	s.Start()
	time.Sleep(runFor)
	if err := s.Shutdown(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// runSchedulers starts three scheduler processes on store for runFor and
// returns how many runs each second had, across them all.
func runSchedulers(t *testing.T, store string, minHold, runFor time.Duration) map[int64]int {
	out := filepath.Join(t.TempDir(), "runs")
	var procs []*testenv.Process
	for i := range 3 {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"=scheduler", "STORE="+store, "OUT="+out,
			"RUN_FOR="+runFor.String(), "MIN_HOLD="+minHold.String())
		procs = append(procs, testenv.Start(t, fmt.Sprintf("scheduler %d", i), cmd))
	}
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
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	runs := map[int64]int{}
	pids := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		pid, sec, ok := strings.Cut(line, " ")
		n, err := strconv.ParseInt(sec, 10, 64)
		if !ok || err != nil {
			t.Fatalf("bad line %q", line)
		}
		runs[n]++
		pids[pid] = true
	}
	t.Logf("%d runs in %d seconds, by %d processes", len(strings.Split(strings.TrimSpace(string(data)), "\n")), len(runs), len(pids))
	return runs
}

// checkOncePerTick fails unless each second ran the job exactly once and
// (nearly) every second of the run had its run.
func checkOncePerTick(t *testing.T, runs map[int64]int, runFor time.Duration) {
	t.Helper()
	var secs []int64
	for s := range runs {
		secs = append(secs, s)
	}
	sort.Slice(secs, func(i, j int) bool { return secs[i] < secs[j] })
	for _, s := range secs {
		if runs[s] != 1 {
			t.Errorf("second %d: %d runs across the schedulers, want 1", s, runs[s])
		}
	}
	if want := int(runFor/time.Second) - 2; len(secs) < want {
		t.Errorf("only %d seconds had a run in %v, want at least %d", len(secs), runFor, want)
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
		checkOncePerTick(t, runSchedulers(t, store, fencedgocron.DefaultMinHold, runFor), runFor)
	})
	t.Run("PostgreSQL", func(t *testing.T) {
		t.Parallel()
		pg := testenv.StartPostgres(t)
		checkOncePerTick(t, runSchedulers(t, pg.URL(), fencedgocron.DefaultMinHold, runFor), runFor)
	})
}
