package fencedsqlite_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/fencedsqlite"
	"github.com/fenced-dev/fenced/internal/testkit/waketest"
)

// openDriver opens a driver of its own on path (a process of its own to
// the waiter queue), closed when the test ends.
func openDriver(t *testing.T, path string) *fencedsqlite.Driver {
	t.Helper()
	d, err := fencedsqlite.OpenFile(context.Background(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// heldKey opens a lease file in a new directory, with a holder (a driver
// of its own) granted the key "job". release(n), for
// waketest.OnePerRelease, releases the holder's grant and grants the key
// again at once to a new owner that does not wait. ctx ends with the test,
// or after a minute.
func heldKey(t *testing.T) (ctx context.Context, path string, holder *fencedsqlite.Driver, release func(n int)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	path = filepath.Join(t.TempDir(), "leases.db")
	holder = openDriver(t, path)
	g := waketest.Grant(t, ctx, holder, "job")
	return ctx, path, holder, func(int) {
		if err := holder.Release(ctx, g); err != nil {
			t.Fatal(err)
		}
		g = waketest.Grant(t, ctx, holder, "job")
	}
}

// Each release wakes one waiting process, the one that has waited longest,
// and no other: 64 waiting processes no longer all read the table and race
// for the write lock on every release. Each process here is a driver of
// its own with its own doorbell, as a process would have. With the one
// shared doorbell, every release woke all three.
func TestReleaseWakesOneProcess(t *testing.T) {
	ctx, path, holder, release := heldKey(t)
	drivers := []*fencedsqlite.Driver{holder}
	var subs []driver.Subscription
	for range 3 {
		d := openDriver(t, path)
		drivers = append(drivers, d)
		subs = append(subs, waketest.Refused(t, ctx, d, "job"))
	}
	waketest.OnePerRelease(t, subs, release, passedOn(drivers))
}

// passedOn returns the count of rings that drivers passed on to the next
// entry because the rung process did not acknowledge in time.
func passedOn(drivers []*fencedsqlite.Driver) func() int64 {
	return func() int64 {
		var n int64
		for _, d := range drivers {
			n += d.RingsPassedOn()
		}
		return n
	}
}

// A process with two waiters for a key takes turns with a process that has
// one: once its first waiter is served (its subscription closed), it goes
// to the end of the queue, and its second waiter is served after the other
// process. Without that it kept the head of the queue (or, taken off by
// the ring, was never rung again).
//
// A ring the rung process did not acknowledge in time is passed on (see
// queue.go), and wakes a second waiter by design. A round where that
// happened proves nothing about the order, so it runs again, up to five
// times; a second wake-up without a ring passed on fails at once.
func TestProcessWithManyWaitersTakesTurns(t *testing.T) {
	for attempt := 1; ; attempt++ {
		if takeTurns(t) {
			return
		}
		if attempt == 5 {
			t.Fatalf("in each of %d rounds a ring was passed on unacknowledged: the order was never seen", attempt)
		}
		t.Logf("round %d: a ring was passed on unacknowledged (a busy machine); again", attempt)
	}
}

// takeTurns is one round of TestProcessWithManyWaitersTakesTurns. It
// reports false if a ring was passed on unacknowledged, which makes the
// order of the wake-ups unknowable.
func takeTurns(t *testing.T) bool {
	ctx, path, holder, release := heldKey(t)
	a, b := openDriver(t, path), openDriver(t, path)
	count := passedOn([]*fencedsqlite.Driver{holder, a, b})
	a1 := waketest.Refused(t, ctx, a, "job")
	a2 := waketest.Refused(t, ctx, a, "job")
	b1 := waketest.Refused(t, ctx, b, "job")
	stood := queueOrder(t, holder, "job")
	if len(stood) != 2 {
		t.Fatalf("the queue of job holds %v, want a's entry and b's", stood)
	}
	woken := func(n int, want driver.Subscription, others ...driver.Subscription) bool {
		t.Helper()
		before := count()
		if !waketest.Woken(want, 10*time.Second) {
			if count() > before {
				return false
			}
			t.Fatalf("release %d woke no waiter of the process whose turn it was", n)
		}
		for _, o := range others {
			if waketest.Woken(o, 200*time.Millisecond) {
				if count() > before {
					return false
				}
				t.Fatalf("release %d woke a second waiter, with no ring passed on", n)
			}
		}
		return count() == before
	}
	release(0)
	if !woken(1, a1, a2, b1) {
		return false
	}
	a1.Close() // served: a has a2 left, and goes to the end
	// a goes to the end in the background. Until it is there, a release
	// may find the queue without it, and a's requeue then rings the first
	// entry itself if the key is free (by design): a2 would be woken too.
	for deadline := time.Now().Add(10 * time.Second); !slices.Equal(queueOrder(t, holder, "job"), []string{stood[1], stood[0]}); {
		if time.Now().After(deadline) {
			t.Fatalf("10s after a's first waiter was served, the queue of job is %v, want %v", queueOrder(t, holder, "job"),
				[]string{stood[1], stood[0]})
		}
		time.Sleep(10 * time.Millisecond)
	}
	release(1)
	if !woken(2, b1, a2) {
		return false
	}
	b1.Close()
	release(2)
	return woken(3, a2)
}

// fail reports err from a child process and returns its exit status.
func fail(err error) int {
	os.Stderr.WriteString(err.Error() + "\n")
	return 1
}

// childWait is a process that waits for KEY in the waiter queue: it
// subscribes, is refused once, prints "waiting", and waits to be killed.
func childWait() int {
	d, err := fencedsqlite.OpenFile(context.Background(), os.Getenv("LEASE_FILE"), nil)
	if err != nil {
		return fail(err)
	}
	key := os.Getenv("KEY")
	if _, err := d.Subscribe(context.Background(), key); err != nil {
		return fail(err)
	}
	if _, err := d.TryAcquire(context.Background(), key, "child", time.Minute); !errors.Is(err, fenced.ErrHeld) {
		return fail(err)
	}
	os.Stdout.WriteString("waiting\n")
	select {}
}

// startWaiter starts a childWait process for key and returns once it
// stands in the queue.
func startWaiter(t *testing.T, path, key string) *os.Process {
	t.Helper()
	cmd := child(t, "wait", path, "KEY="+key)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "waiting\n" {
		t.Fatalf("waiting child said %q, %v", line, err)
	}
	return cmd.Process
}

// queueRows counts the entries in the waiter queue of the default table
// whose member starts with prefix.
func queueRows(t *testing.T, d *fencedsqlite.Driver, prefix string) int {
	t.Helper()
	var n int
	err := d.DB().QueryRow(`SELECT count(*) FROM `+fencedsqlite.DefaultTable+`_waiters WHERE substr(member, 1, length(?1)) = ?1`, prefix).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// queueOrder returns the members of key's waiter queue, first first.
func queueOrder(t *testing.T, d *fencedsqlite.Driver, key string) []string {
	t.Helper()
	rows, err := d.DB().Query(`SELECT member FROM `+fencedsqlite.DefaultTable+`_waiters WHERE key = ?1 ORDER BY seq`, key)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var members []string
	for rows.Next() {
		var m string
		if err := rows.Scan(&m); err != nil {
			t.Fatal(err)
		}
		members = append(members, m)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return members
}

// queueState describes the waiter queue of path for a failure message:
// its entries, the doorbells beside the file, and the rings holder passed
// on unacknowledged.
func queueState(t *testing.T, path string, holder *fencedsqlite.Driver) string {
	t.Helper()
	var b strings.Builder
	rows, err := holder.DB().Query(`SELECT member, key, seq FROM ` + fencedsqlite.DefaultTable + `_waiters ORDER BY key, seq`)
	if err != nil {
		return "queue: " + err.Error()
	}
	defer rows.Close()
	b.WriteString("queue [")
	for rows.Next() {
		var member, key string
		var seq int64
		if err := rows.Scan(&member, &key, &seq); err != nil {
			return "queue: " + err.Error()
		}
		fmt.Fprintf(&b, " %s:%s@%d", key, member, seq)
	}
	b.WriteString(" ]; doorbells [")
	bells, _ := os.ReadDir(path + ".waiters")
	for _, e := range bells {
		b.WriteString(" " + e.Name())
	}
	fmt.Fprintf(&b, " ]; rings passed on unacknowledged by the releaser: %d", holder.RingsPassedOn())
	return b.String()
}

// wakeLatency measures how long after a release begins a live waiter,
// first in the queue of a key of its own, is woken: the control for the
// wake-ups passed on past dead or stopped processes. It returns the
// slowest of three.
func wakeLatency(t *testing.T, ctx context.Context, path string, holder *fencedsqlite.Driver) time.Duration {
	t.Helper()
	g := waketest.Grant(t, ctx, holder, "control")
	w := openDriver(t, path)
	s := waketest.Refused(t, ctx, w, "control")
	var slowest time.Duration
	for n := range 3 {
		if n > 0 {
			// Granted again, and refused again: the rung waiter stands
			// again at the end of the queue, first.
			g = waketest.Grant(t, ctx, holder, "control")
			if _, err := w.TryAcquire(ctx, "control", "refused", time.Minute); !errors.Is(err, fenced.ErrHeld) {
				t.Fatalf("try of the held control key: %v", err)
			}
		}
		start := time.Now()
		if err := holder.Release(ctx, g); err != nil {
			t.Fatal(err)
		}
		if !waketest.Woken(s, 10*time.Second) {
			t.Fatal("the control release did not wake its waiter")
		}
		slowest = max(slowest, time.Since(start))
	}
	return slowest
}

// A waiting process killed with SIGKILL leaves its entry and its doorbell
// behind: the next release finds nobody holding the doorbell, deletes
// both, and rings the next process. A waiting process stopped with SIGSTOP
// still holds its doorbell: the release rings it, and as it does not
// acknowledge the ring, rings the next process. So the one release wakes
// the live waiter behind both, promptly: within the longest wait for an
// acknowledgement (AckCap by construction, as long as a timer of AckCap
// started with the release takes to fire here) plus twice the slowest wake-up
// of a live first waiter measured in this run (a ring and a wake-up each)
// plus 50 ms. Before, the stopped process took the release's wake-up and
// the live waiter waited for its fallback timer (1.3-1.7 s through the
// Client; here, with no timer, for the next release).
func TestRingPassesOverDeadAndStoppedProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("long: kill -9 and SIGSTOP of waiter processes; run without -short")
	}
	ctx, path, holder, _ := heldKey(t)
	control := wakeLatency(t, ctx, path, holder)
	g := waketest.Grant(t, ctx, holder, "fault")
	killed := startWaiter(t, path, "fault")
	stopped := startWaiter(t, path, "fault")
	live := waketest.Refused(t, ctx, openDriver(t, path), "fault")
	bells, err := os.ReadDir(path + ".waiters")
	if err != nil || len(bells) != 4 {
		t.Fatalf("doorbells: %v, %v; want 4 (two children, the live and the control waiters; the holder never waited)", bells, err)
	}
	if err := killed.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed.Wait()
	stopProcess(t, stopped)
	defer stopped.Signal(syscall.SIGCONT)

	start := time.Now()
	// A timer of AckCap started with the release, in this process as the
	// ringer's wait for the acknowledgement is: how long that wait really
	// lasts on this machine now (a busy one fires it late).
	ackWait := make(chan time.Duration, 1)
	time.AfterFunc(fencedsqlite.AckCap, func() { ackWait <- time.Since(start) })
	// Skips the killed process, rings the stopped one, then the live one.
	if err := holder.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	if !waketest.Woken(live, 10*time.Second) {
		t.Fatalf("the release did not wake the live waiter behind a killed and a stopped process: %s", queueState(t, path, holder))
	}
	took := time.Since(start)
	if after, err := os.ReadDir(path + ".waiters"); err != nil || len(after) != 3 {
		t.Errorf("doorbells after the ring: %v, %v; want the killed process's removed", after, err)
	}
	// The rung entries are taken off in the background, after the ring.
	rows := queueRows(t, holder, "")
	for deadline := time.Now().Add(5 * time.Second); rows != 0 && time.Now().Before(deadline); rows = queueRows(t, holder, "") {
		time.Sleep(10 * time.Millisecond)
	}
	if rows != 0 {
		t.Errorf("queue rows left after 5s: %d; want none (each was taken off by its ring)", rows)
	}
	// The bound: the wait for the stopped process's acknowledgement (AckCap
	// as long as the timer took to fire), plus twice the slowest wake-up of
	// a live first waiter measured in this run, before and after the fault
	// (a ring and a wake-up each: the load changes within seconds), plus
	// 50 ms.
	control = max(control, wakeLatency(t, ctx, path, holder))
	waited := <-ackWait
	bound := waited + 2*control + 50*time.Millisecond
	t.Logf("live waiter woken %v after the release began (an AckCap timer fired after %v; control: a live first waiter within %v; bound %v)",
		took.Round(time.Millisecond), waited.Round(time.Millisecond), control.Round(time.Millisecond), bound.Round(time.Millisecond))
	if took > bound {
		t.Errorf("the live waiter was woken %v after the release, behind a stopped process; want within %v", took, bound)
	}
}

// A process that cannot make a doorbell of its own (here the doorbells'
// directory is a file) waits on the shared doorbell: it stands in no
// queue, and every release wakes it, as a look finds the key free (so the
// key is granted again only after the wake-up).
func TestWaiterWithoutDoorbellUsesSharedOne(t *testing.T) {
	ctx, path, holder, _ := heldKey(t)
	if err := os.WriteFile(path+".waiters", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	g := waketest.Grant(t, ctx, holder, "shared")
	s := waketest.Refused(t, ctx, openDriver(t, path), "shared")
	if n := queueRows(t, holder, ""); n != 0 {
		t.Fatalf("%d queue entries, want none", n)
	}
	for n := range 2 {
		if err := holder.Release(ctx, g); err != nil {
			t.Fatal(err)
		}
		if !waketest.Woken(s, 10*time.Second) {
			t.Fatalf("release %d did not wake the waiter through the shared doorbell", n+1)
		}
		g = waketest.Grant(t, ctx, holder, "shared")
	}
}

// A waiter table made by someone else with another shape is refused with
// ErrSchema, and the refused open creates nothing.
func TestForeignWaiterTableIsRefused(t *testing.T) {
	ctx := context.Background()
	db := plainDB(t)
	if _, err := db.ExecContext(ctx, `CREATE TABLE jobs_waiters (member TEXT NOT NULL, key TEXT NOT NULL, seq INTEGER NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	d, err := fencedsqlite.New(ctx, db, &fencedsqlite.Options{Table: "jobs"})
	if err == nil {
		d.Close()
		t.Fatal("New accepted a waiter table without a unique member")
	}
	if !errors.Is(err, fencedsqlite.ErrSchema) || !strings.Contains(err.Error(), "jobs_waiters") {
		t.Fatalf("New: %v\nwant ErrSchema naming jobs_waiters", err)
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_schema WHERE name IN ('jobs', 'jobs_breaks', 'jobs_floor')`).Scan(&n); err != nil || n != 0 {
		t.Errorf("the refused open created %d tables (%v)", n, err)
	}
}

// A waiter rung for a key that someone else took before it tried is woken
// all the same, and its refused try stands its process in the queue
// again: the next release wakes it again. A ring that woke nobody because
// the key looked taken, or a process left off the queue after its refused
// try, would leave the waiter to its fallback timer.
func TestRungWaiterRefusedStandsAgain(t *testing.T) {
	ctx, path, _, release := heldKey(t)
	w := openDriver(t, path)
	s := waketest.Refused(t, ctx, w, "job")
	for n := range 3 {
		release(n) // the key is granted again at once
		if !waketest.Woken(s, 10*time.Second) {
			t.Fatalf("release %d did not wake the waiter", n+1)
		}
		if _, err := w.TryAcquire(ctx, "job", "waiter", time.Minute); !errors.Is(err, fenced.ErrHeld) {
			t.Fatalf("try after release %d: %v, want ErrHeld", n+1, err)
		}
	}
}

// A refused try of a process that was not rung (a waiter's timer, another
// acquisition of the same process) keeps its place in the queue: only a
// ring's refused try goes to the end.
func TestRefusedTryKeepsPlace(t *testing.T) {
	ctx, path, _, release := heldKey(t)
	a, b := openDriver(t, path), openDriver(t, path)
	sa := waketest.Refused(t, ctx, a, "job")
	sb := waketest.Refused(t, ctx, b, "job")
	for range 3 {
		if _, err := a.TryAcquire(ctx, "job", "another", time.Minute); !errors.Is(err, fenced.ErrHeld) {
			t.Fatalf("try: %v, want ErrHeld", err)
		}
	}
	release(0)
	if !waketest.Woken(sa, 10*time.Second) {
		t.Fatal("the release did not wake the process first in the queue")
	}
	if waketest.Woken(sb, 200*time.Millisecond) {
		t.Fatal("the release woke the second process too")
	}
}

// Entries written by someone else cannot stall a release or make it open
// something else: a FIFO, a symbolic link and a name with a slash in the
// place of doorbells are passed over, and the next waiter is rung.
func TestForeignEntriesArePassedOver(t *testing.T) {
	ctx, path, holder, release := heldKey(t)
	dir := path + ".waiters"
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo:1"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/dev/zero", filepath.Join(dir, "link:1")); err != nil {
		t.Fatal(err)
	}
	for i, member := range []string{"fifo:1", "link:1", "../leases.db"} {
		if _, err := holder.DB().Exec(`INSERT INTO `+fencedsqlite.DefaultTable+`_waiters (member, key, seq) VALUES (?1, 'job', ?2)`, member, -3+i); err != nil {
			t.Fatal(err)
		}
	}
	s := waketest.Refused(t, ctx, openDriver(t, path), "job")
	done := make(chan struct{})
	go func() { release(0); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the release did not return: it blocked on a foreign entry")
	}
	if !waketest.Woken(s, 10*time.Second) {
		t.Fatal("the release did not wake the waiter behind the foreign entries")
	}
}

// stopProcess sends SIGSTOP to p and returns once every thread of p shows
// as stopped in /proc. The signal is delivered to one thread, which stops
// the others once it runs: on a busy machine the others may run on for a
// while, and the process would still hear and acknowledge a ring sent just
// after the signal (it then stops before its waiter tries, and the ring
// is lost with it).
func stopProcess(t *testing.T, p *os.Process) {
	t.Helper()
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); !threadsStopped(p.Pid); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("process %d not stopped 10s after SIGSTOP", p.Pid)
		}
	}
}

// threadsStopped reports whether every thread of process pid is stopped
// (state T or t in /proc/PID/task/TID/stat).
func threadsStopped(pid int) bool {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			return false
		}
		// The state follows the command name, which is in parentheses.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || i+2 >= len(b) || (b[i+2] != 'T' && b[i+2] != 't') {
			return false
		}
	}
	return true
}
