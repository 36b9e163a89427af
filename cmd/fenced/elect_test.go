package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// busyTimeout is the SQLite busy timeout of the stores of the tests of a
// busy store; an open gives up on the init lock after initWait.
const (
	busyTimeout = 300 * time.Millisecond
	initWait    = 3 * busyTimeout // fencedsqlite's initLockWait
)

// busyStore returns a SQLite store with busyTimeout whose file is not set
// up yet, and a function that takes its init lock (the flock on the file
// beside it that every process setting the file up takes, see
// fencedsqlite.lockInit) as another such process would, and returns the
// lock's release.
func busyStore(t *testing.T) (store string, lock func() (unlock func())) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "leases.db")
	store = "sqlite://" + path + "?busy_timeout=" + busyTimeout.String()
	// A file not set up yet, whose init lock a sibling holds while it
	// sets it up: every open waits for it. (Opening a file already set
	// up takes no lock.)
	return store, func() func() {
		f, err := os.OpenFile(path+".lock", os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			t.Fatal(err)
		}
		var once bool
		unlock := func() {
			if !once {
				once = true
				f.Close()
			}
		}
		t.Cleanup(unlock)
		return unlock
	}
}

// Issue 38: a follower of fenced elect started while another process holds
// the store's init lock (a sibling opening it on a loaded machine) waits
// for the store, saying so, instead of exiting 69 after the busy timeout,
// and leads once the lock is free.
func TestElectWaitsForBusyStore(t *testing.T) {
	store, lock := busyStore(t)
	dir := t.TempDir()
	unlock := lock()
	started := time.Now()
	cmd, _, errb := startRun(t, store, "elect", "--ttl", "1s", "svc", "--",
		"sh", "-c", `echo "$FENCED_EPOCH" > "`+dir+`/lead"; exec sleep 1000`)
	eventually(t, 30*time.Second, "elect did not say it waits for the busy store", func() bool {
		return strings.Contains(errb.String(), "the store is busy") || !alive(cmd.Process.Pid)
	})
	// startup: exec, the runtime's start and the first open, which gave up
	// after initWait; what this machine takes to start a fenced.
	startup := time.Since(started) - initWait
	// Several more opens give up meanwhile: the follower must outlast them.
	time.Sleep(2 * initWait)
	if !alive(cmd.Process.Pid) {
		t.Fatalf("elect exited while the store was busy (exit %d); stderr:\n%s", waitExit(t, cmd, 10*time.Second), errb)
	}
	if _, err := os.Stat(filepath.Join(dir, "lead")); err == nil {
		t.Fatal("elect led while another process held the init lock")
	}
	unlock()
	freed := time.Now()
	// Once the lock is free, the follower opens at its next try, at most
	// busyMostRetry later, and an open, an election and the COMMAND's
	// start take about what a start took: bound = busyMostRetry + 4 ×
	// startup, at least 5 s.
	bound := max(busyMostRetry+4*startup, 5*time.Second)
	eventually(t, bound+30*time.Second, "elect did not lead once the store was free", func() bool {
		_, err := os.Stat(filepath.Join(dir, "lead"))
		return err == nil
	})
	took := time.Since(freed)
	t.Logf("led %v after the init lock was freed; startup %v, bound %v", took.Round(time.Millisecond), startup.Round(time.Millisecond), bound)
	if took > bound {
		t.Errorf("elect led %v after the init lock was freed, over the bound %v (busyMostRetry %v + 4 × startup %v)",
			took.Round(time.Millisecond), bound, busyMostRetry, startup.Round(time.Millisecond))
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	waitExit(t, cmd, 20*time.Second)
}

// Issue 38: fenced run --wait waits for a busy store within its --wait, as
// fenced elect and fenced observe do; run without --wait tries it once and exits 69; so
// does run --wait when the store stays busy for the whole wait, saying how
// long it waited; a SIGTERM ends the wait; and a store that cannot open
// for a reason that does not pass (no directory) fails at once, without
// waiting.
func TestRunWaitsForBusyStore(t *testing.T) {
	t.Parallel()
	store, lock := busyStore(t)
	unlock := lock()

	if r := cli(t, store, "run", "k", "--", "true"); r.code != exitUnavailable || strings.Contains(r.stderr, "opening it again") {
		t.Fatalf("run without --wait on a busy store: exit %d, stderr %q; want 69 at the first busy open", r.code, r.stderr)
	}
	r := cli(t, store, "run", "--wait", "1500ms", "k", "--", "true")
	if r.code != exitUnavailable || !strings.Contains(r.stderr, "the store is busy") || !strings.Contains(r.stderr, "--wait 1.5s ran out") {
		t.Fatalf("run --wait 1500ms on a store busy throughout: exit %d, stderr %q; want 69 saying it waited", r.code, r.stderr)
	}

	stopped, _, stoppedErr := startRun(t, store, "run", "--wait", "60s", "k", "--", "true")
	waiter, out, errb := startRun(t, store, "run", "--wait", "60s", "k", "--", "echo", "ran")
	obs, obsOut, obsErr := startRun(t, store, "observe", "-o", "json", "k") // waits as a follower does
	eventually(t, 30*time.Second, "run --wait and observe did not say they wait for the busy store", func() bool {
		return strings.Contains(errb.String(), "the store is busy") && strings.Contains(stoppedErr.String(), "the store is busy") &&
			strings.Contains(obsErr.String(), "the store is busy")
	})
	_ = stopped.Process.Signal(syscall.SIGTERM)
	if code := waitExit(t, stopped, 20*time.Second); code == 0 || !strings.Contains(stoppedErr.String(), "interrupted by terminated") {
		t.Fatalf("SIGTERM while waiting for the store: exit %d, stderr %q", code, stoppedErr)
	}
	time.Sleep(2 * initWait) // more opens give up meanwhile
	if !alive(waiter.Process.Pid) {
		t.Fatalf("run --wait 60s exited while the store was busy (exit %d); stderr:\n%s", waitExit(t, waiter, 10*time.Second), errb)
	}
	if !alive(obs.Process.Pid) {
		t.Fatalf("observe exited while the store was busy (exit %d); stderr:\n%s", waitExit(t, obs, 10*time.Second), obsErr)
	}
	unlock()
	eventually(t, 30*time.Second, "observe printed nothing once the store was free", func() bool {
		return strings.Contains(obsOut.String(), `"name":"k"`)
	})
	_ = obs.Process.Signal(syscall.SIGINT)
	waitExit(t, obs, 20*time.Second)
	if code := waitExit(t, waiter, 30*time.Second); code != 0 || strings.TrimSpace(out.String()) != "ran" {
		t.Fatalf("run --wait once the store was free: exit %d, stdout %q, stderr %q", code, out, errb)
	}

	gone := "sqlite://" + filepath.Join(t.TempDir(), "no-such-dir", "leases.db")
	for _, args := range [][]string{{"run", "--wait", "60s", "k", "--", "true"}, {"elect", "svc", "--", "true"}} {
		start := time.Now()
		r := cli(t, gone, args...)
		if r.code != exitUsage || strings.Contains(r.stderr, "busy") {
			t.Fatalf("%s on a store with no directory: exit %d after %v, stderr %q; want 64 at once",
				args[0], r.code, time.Since(start).Round(time.Millisecond), r.stderr)
		}
	}
}
