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

// childSlowRelease takes the key LEASE_KEY, prints "held", releases it
// when a line arrives on stdin and prints "released MICROSECONDS
// UNIXNANO" (how long the release took, and the wall-clock time it
// returned), and takes it again at the next line, until stdin ends.
func childSlowRelease() int {
	c, err := openChild()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer c.Close()
	ctx := context.Background()
	key := os.Getenv("LEASE_KEY")
	in := bufio.NewScanner(os.Stdin)
	for {
		l, err := c.TryAcquire(ctx, key, &fenced.LeaseOptions{TTL: time.Minute})
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

// releaser drives a childSlowRelease process from a test.
type releaser struct {
	t     *testing.T
	key   string
	stdin io.WriteCloser
	out   *bufio.Reader
}

// startReleaser starts a childSlowRelease process for key on file, under
// the command prefix (strace and its flags, or nothing), and waits until
// it holds the key. The process ends with the test.
func startReleaser(t *testing.T, file, key string, prefix ...string) *releaser {
	t.Helper()
	args := append(prefix, os.Args[0], "-test.run=^$")
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(os.Environ(), childEnv+"=slowrelease", "LEASE_FILE="+file, "LEASE_KEY="+key)
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
	t.Cleanup(func() {
		stdin.Close()
		if err := cmd.Wait(); err != nil {
			t.Errorf("releasing process of %s: %v", key, err)
		}
	})
	r := &releaser{t: t, key: key, stdin: stdin, out: bufio.NewReader(stdout)}
	r.expect("held")
	return r
}

// expect reads the process's next line, fails unless it begins with
// word, and returns the rest.
func (r *releaser) expect(word string) string {
	r.t.Helper()
	line, err := r.out.ReadString('\n')
	if err != nil {
		r.fatal(fmt.Errorf("%v (waiting for %q)", err, word))
	}
	f := strings.Fields(line)
	if len(f) == 0 || f[0] != word {
		r.t.Fatalf("releasing process of %s said %q, want %q", r.key, line, word)
	}
	return strings.Join(f[1:], " ")
}

// fatal ends the test with the process's error.
func (r *releaser) fatal(err error) {
	r.t.Helper()
	r.t.Fatalf("releasing process of %s: %v", r.key, err)
}

// say writes a line to the process.
func (r *releaser) say(line string) {
	r.t.Helper()
	if _, err := io.WriteString(r.stdin, line+"\n"); err != nil {
		r.fatal(err)
	}
}

// handOver has a waiter of this process wait for the key, has the
// process release it, and returns how long its release took and how long
// after its commit returned the waiter had the key (both processes read
// the same wall clock). The waiter's lease is released, and the process
// holds the key again on return.
func (r *releaser) handOver(c *fenced.Client) (took, late time.Duration) {
	r.t.Helper()
	ctx := context.Background()
	type result struct {
		l   *fenced.Lease
		at  time.Time
		err error
	}
	got := make(chan result, 1)
	go func() {
		l, err := c.Acquire(ctx, r.key, &fenced.LeaseOptions{MaxWait: 10 * time.Second})
		got <- result{l, time.Now(), err}
	}()
	// Let the waiter find the key held and subscribe.
	time.Sleep(300 * time.Millisecond)
	r.say("release")
	// The releasing process's own times: how long its release took, and
	// when it returned. Its wake-up to read the line is not the waiter's.
	var us, returned int64
	if _, err := fmt.Sscan(r.expect("released"), &us, &returned); err != nil {
		r.t.Fatal(err)
	}
	res := <-got
	if res.err != nil {
		r.t.Fatal(res.err)
	}
	if err := res.l.Release(ctx); err != nil {
		r.t.Fatal(err)
	}
	r.say("again")
	r.expect("held")
	return time.Duration(us) * time.Microsecond, res.at.Sub(time.Unix(0, returned))
}

// TestWaiterInAnotherProcessIsWokenAfterSlowSync releases a key from a
// process whose every fsync and fdatasync the kernel delays by slowSync
// (strace's delay injection: the driver is pure Go and makes its system
// calls itself, so an LD_PRELOAD library would not see them), while a
// waiter in this process waits for the key with the client's fallback
// timer at its default 2s. The waiter must take the key about as soon
// after the release's commit as it takes a key released by a process
// whose syncs are not delayed (the control, measured in the same run):
// the commit's frames reach the WAL (which the kernel reports) a whole
// slowSync before the commit becomes visible, so a watcher that looks for
// the commit only for a while after the WAL write misses it and the
// waiter sleeps until its fallback timer.
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
	slow := startReleaser(t, file, "proc:slowsync", strace, "-f", "-qq", "--seccomp-bpf", "-o", "/dev/null",
		"-e", "signal=none", "-e", "trace=fsync,fdatasync", "-e", "inject=fsync,fdatasync:delay_enter="+delay)
	control := startReleaser(t, file, "proc:control")

	const rounds = 3
	var worst, controlWorst time.Duration
	late := testenv.SampleLateness()
	defer late.Stop()
	for round := 0; round < rounds; round++ {
		took, l := control.handOver(c)
		t.Logf("round %d, control: release took %v; the waiter had the key %v after its commit returned", round, took, l)
		controlWorst = max(controlWorst, l)
		took, l = slow.handOver(c)
		t.Logf("round %d: release took %v (fsync delayed %v); the waiter had the key %v after its commit returned", round, took, slowSync, l)
		if took < slowSync {
			t.Fatalf("the release took %v, less than the injected fsync delay %v: the delay did not apply", took, slowSync)
		}
		worst = max(worst, l)
	}
	// 100ms on a quiet machine, plus four times the worst timer lateness
	// and twice the worst control handover this run saw (a busy machine
	// wakes the waiter's watcher and the waiter late too); capped at half
	// the fallback timer (2s), so a waiter that slept until its fallback
	// still fails.
	bound := min(100*time.Millisecond+4*late.Max()+2*controlWorst, time.Second)
	if worst > bound {
		t.Fatalf("a waiter took the key up to %v after the slowed release's commit returned, want within %v (100ms + 4 × timer lateness %v + 2 × control handover %v)",
			worst, bound, late.Max(), controlWorst)
	}
}
