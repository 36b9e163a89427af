package fencedsqlite_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fencedsqlite"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// slowSync is how long every fsync and fdatasync of the releasing process
// takes in TestWaiterInAnotherProcessIsWokenAfterSlowSync: well past the
// 50ms the watcher once waited for a commit to show after the kernel
// reported its write to the WAL.
const slowSync = 200 * time.Millisecond

// childSlowRelease takes proc:slowsync, prints "held", releases it when a
// line arrives on stdin and prints "released MICROSECONDS UNIXNANO" (how
// long the release took, and the wall-clock time it returned), and takes
// it again at the next line, until stdin ends.
func childSlowRelease() int {
	c, err := openChild()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer c.Close()
	ctx := context.Background()
	in := bufio.NewScanner(os.Stdin)
	for {
		l, err := c.TryAcquire(ctx, "proc:slowsync", &fenced.LeaseOptions{TTL: time.Minute})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Println("held")
		if !in.Scan() {
			return 0
		}
		began := time.Now()
		if err := l.Release(ctx); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Println("released", time.Since(began).Microseconds(), time.Now().UnixNano())
		if !in.Scan() {
			return 0
		}
	}
}

// TestWaiterInAnotherProcessIsWokenAfterSlowSync releases a key from a
// process whose every fsync and fdatasync the kernel delays by slowSync
// (strace's delay injection: the driver is pure Go and makes its system
// calls itself, so an LD_PRELOAD library would not see them), while a
// waiter in this process waits for the key with the client's fallback
// timer at its default 2s. The waiter must take the key within 100ms of
// the release's commit: the commit's frames reach the WAL (which the
// kernel reports) a whole slowSync before the commit becomes visible, so
// a watcher that looks for the commit only for a while after the WAL
// write misses it and the waiter sleeps until its fallback timer.
func TestWaiterInAnotherProcessIsWokenAfterSlowSync(t *testing.T) {
	strace, err := exec.LookPath("strace")
	if err != nil {
		t.Fatalf("this test delays the releasing process's fsync with strace (Debian package strace): %v", err)
	}
	file := filepath.Join(t.TempDir(), "leases.db")
	d, err := fencedsqlite.OpenFile(context.Background(), file, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := fenced.NewClient(d, nil)
	defer c.Close()

	delay := strconv.FormatInt(slowSync.Microseconds(), 10)
	cmd := exec.Command(strace, "-f", "-qq", "--seccomp-bpf", "-o", "/dev/null", "-e", "signal=none",
		"-e", "trace=fsync,fdatasync", "-e", "inject=fsync,fdatasync:delay_enter="+delay,
		os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=slowrelease", "LEASE_FILE="+file)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stdin.Close()
		if err := cmd.Wait(); err != nil {
			t.Errorf("releasing process: %v", err)
		}
	}()
	out := bufio.NewReader(stdout)
	expect := func(word string) string {
		t.Helper()
		line, err := out.ReadString('\n')
		if err != nil {
			t.Fatalf("releasing process: %v (waiting for %q)", err, word)
		}
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != word {
			t.Fatalf("releasing process said %q, want %q", line, word)
		}
		return strings.Join(f[1:], " ")
	}

	ctx := context.Background()
	const rounds = 3
	var worst time.Duration
	late := testenv.SampleLateness()
	defer late.Stop()
	for round := 0; round < rounds; round++ {
		expect("held")
		type result struct {
			l   *fenced.Lease
			at  time.Time
			err error
		}
		got := make(chan result, 1)
		go func() {
			l, err := c.Acquire(ctx, "proc:slowsync", &fenced.LeaseOptions{MaxWait: 10 * time.Second})
			got <- result{l, time.Now(), err}
		}()
		// Let the waiter find the key held and subscribe.
		time.Sleep(300 * time.Millisecond)
		asked := time.Now()
		if _, err := io.WriteString(stdin, "release\n"); err != nil {
			t.Fatal(err)
		}
		// The releasing process's own times: how long its release took,
		// and when it returned (wall clock, shared by both processes).
		// Its wake-up to read the line is not the waiter's lateness.
		var us, returned int64
		if _, err := fmt.Sscan(expect("released"), &us, &returned); err != nil {
			t.Fatal(err)
		}
		took := time.Duration(us) * time.Microsecond
		if took < slowSync {
			t.Fatalf("the release took %v, less than the injected fsync delay %v: the delay did not apply", took, slowSync)
		}
		r := <-got
		if r.err != nil {
			t.Fatal(r.err)
		}
		handover := r.at.Sub(asked)
		t.Logf("round %d: release took %v (fsync delayed %v); the waiter had the key %v after the release began", round, took, slowSync, handover)
		if late := r.at.Sub(time.Unix(0, returned)); late > worst {
			worst = late
		}
		if err := r.l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(stdin, "again\n"); err != nil {
			t.Fatal(err)
		}
	}
	expect("held")
	// 100ms on a quiet machine, plus four times the worst timer lateness
	// this run saw (a busy machine wakes the waiter's watcher late too);
	// capped at half the fallback timer (2s), so a waiter that slept until
	// its fallback still fails.
	bound := min(100*time.Millisecond+4*late.Max(), time.Second)
	if worst > bound {
		t.Fatalf("a waiter took the key up to %v after the release's commit returned, want within %v (100ms + 4 × timer lateness %v)", worst, bound, late.Max())
	}
}
