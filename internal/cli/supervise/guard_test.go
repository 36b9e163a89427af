package supervise

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// TestKillByKillsUnlessMoved checks the guard's deadline: a tree whose
// deadline keeps moving ahead runs on past every earlier one; once it
// stops moving, the guard kills the tree by itself, the supervisor doing
// nothing. Each move must be sent before the deadline it moves: a run in
// which this process slept past one (a busy machine) proves nothing and
// runs again with the deadlines twice as far apart, up to 2.4 s.
func TestKillByKillsUnlessMoved(t *testing.T) {
	for step := 300 * time.Millisecond; ; step *= 2 {
		if killByMoves(t, step) || step >= 2400*time.Millisecond {
			return
		}
		t.Logf("a move came later than the deadline it moved (step %v): again with %v", step, 2*step)
	}
}

// killByMoves runs TestKillByKillsUnlessMoved with deadlines step ahead.
// It reports false, having judged nothing, if a move was sent late.
func killByMoves(t *testing.T, step time.Duration) bool {
	g, err := StartKillBy(exec.Command("sleep", "60"), time.Now().Add(step))
	if err != nil {
		t.Fatal(err)
	}
	defer end(t, g)
	last := time.Now().Add(step)
	for range 10 {
		time.Sleep(step / 3)
		if time.Now().After(last.Add(-step / 3)) {
			return false // too close to, or past, the deadline it moves
		}
		last = time.Now().Add(step)
		g.KillBy(last)
	}
	select {
	case ev := <-g.Events():
		t.Fatalf("event %+v while its deadline kept moving ahead: the guard killed a tree it was told to spare", ev)
	default:
	}
	ev := next(t, g, 20*time.Second)
	took := time.Since(last)
	if ev.Kind != Exited || ev.Signal != syscall.SIGKILL {
		t.Fatalf("event %+v, want the leader killed by SIGKILL", ev)
	}
	if took < 0 {
		t.Fatalf("the tree was killed %v before its last deadline", -took)
	}
	t.Logf("the guard killed the tree %v after its last deadline (step %v)", took.Round(time.Millisecond), step)
	return true
}

// TestGuardPriority checks that every thread of the guard runs with
// guardPolicy where a process may take a real-time policy (root with
// CAP_SYS_NICE, which this test finds out by trying on one thread of its
// own), at guardNice where it may only raise its nice, and as it was (0)
// otherwise.
func TestGuardPriority(t *testing.T) {
	g := start(t, exec.Command("sleep", "60"))
	want := threadPriority{}
	switch {
	case mayTake(func() error { a := guardPolicy; return unix.SchedSetAttr(0, &a, 0) }):
		want = threadPriority{policy: int(guardPolicy.Policy), rtPriority: int(guardPolicy.Priority)}
	case mayTake(func() error { return unix.Setpriority(unix.PRIO_PROCESS, 0, guardNice) }):
		want.nice = guardNice
	}
	dir := "/proc/" + strconv.Itoa(int(g.guardPid.Load())) + "/task"
	var got map[string]threadPriority
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		got = threadPriorities(t, dir)
		ok := len(got) > 0
		for _, p := range got {
			ok = ok && p == want
		}
		if ok {
			return
		}
	}
	t.Fatalf("the guard's threads run with %+v, want %+v each (euid %d)", got, want, os.Geteuid())
}

// mayTake reports whether raise succeeds on a thread of this process's
// own, which the runtime then ends with what raise set.
func mayTake(raise func() error) bool {
	ok := make(chan bool)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		ok <- raise() == nil
	}()
	return <-ok
}

// threadPriority is what /proc says of a thread's scheduling.
type threadPriority struct{ nice, rtPriority, policy int }

// threadPriorities reads the scheduling of each thread listed in dir, a
// /proc/PID/task directory.
func threadPriorities(t *testing.T, dir string) map[string]threadPriority {
	t.Helper()
	tasks, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]threadPriority{}
	for _, task := range tasks {
		stat, err := os.ReadFile(dir + "/" + task.Name() + "/stat")
		if err != nil {
			continue // gone meanwhile
		}
		// Fields 19 (nice), 40 (rt_priority) and 41 (policy), counted
		// from the one after the command's name, which ends with the
		// last ')'.
		fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		nice, err1 := strconv.Atoi(fields[16])
		rt, err2 := strconv.Atoi(fields[37])
		policy, err3 := strconv.Atoi(fields[38])
		if err1 == nil && err2 == nil && err3 == nil {
			out[task.Name()] = threadPriority{nice: nice, rtPriority: rt, policy: policy}
		}
	}
	return out
}

// TestTellGuardNeverBlocks checks that orders to a guard that reads none
// (stopped) never block the supervisor once its pipe is full: each waits
// at most guardWriteWait and is dropped. Continued, the guard still acts
// on an order it read.
func TestTellGuardNeverBlocks(t *testing.T) {
	g := start(t, exec.Command("sleep", "60"))
	guard := int(g.guardPid.Load())
	if err := syscall.Kill(guard, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(guard, syscall.SIGCONT) })
	lat := testenv.SampleLateness() // this process's scheduling, for the bound below
	defer lat.Stop()
	far := time.Now().Add(time.Hour)
	// A pipe holds 64 KiB (Linux's default); an order is under 32 bytes.
	// So the first few thousand fill it, and the last 200 find it full.
	n := 65536/len(fmt.Sprintf("kill-by %d\n", boottime())) + 200
	for i := range n {
		began := time.Now()
		g.KillBy(far)
		// A second is a hundred times guardWriteWait, plus twice the worst
		// scheduling delay seen: what is checked is that a full pipe does
		// not hold the supervisor, not how fast.
		if took, bound := time.Since(began), time.Second+2*lat.Max(); took > bound {
			t.Fatalf("order %d of %d to a stopped guard took %v (bound %v)", i+1, n, took, bound)
		}
	}
	if err := syscall.Kill(guard, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-g.Events():
		t.Fatalf("event %+v: the continued guard acted on a deadline an hour ahead", ev)
	case <-time.After(500 * time.Millisecond):
	}
}
