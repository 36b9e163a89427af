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

// TestGuardNice checks that every thread of the guard has a nice of
// guardNice where a process may raise its priority (root with
// CAP_SYS_NICE, which this test finds out by raising one thread of its
// own and putting it back), and its own (0) otherwise.
func TestGuardNice(t *testing.T) {
	g := start(t, exec.Command("sleep", "60"))
	want := 0
	if mayRaisePriority() {
		want = guardNice
	}
	dir := "/proc/" + strconv.Itoa(int(g.guardPid.Load())) + "/task"
	var got map[string]int
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		got = threadNices(t, dir)
		ok := len(got) > 0
		for _, n := range got {
			ok = ok && n == want
		}
		if ok {
			return
		}
	}
	t.Fatalf("the guard's threads run at nice %v, want %d each (euid %d)", got, want, os.Geteuid())
}

// mayRaisePriority reports whether this process may lower a thread's
// nice to guardNice. It tries on a thread of its own, which it puts back
// to 0 (always allowed) and then lets the runtime end.
func mayRaisePriority() bool {
	ok := make(chan bool)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		err := unix.Setpriority(unix.PRIO_PROCESS, 0, guardNice)
		_ = unix.Setpriority(unix.PRIO_PROCESS, 0, 0)
		ok <- err == nil
	}()
	return <-ok
}

// threadNices reads the nice value of each thread listed in dir, a
// /proc/PID/task directory.
func threadNices(t *testing.T, dir string) map[string]int {
	t.Helper()
	tasks, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, task := range tasks {
		stat, err := os.ReadFile(dir + "/" + task.Name() + "/stat")
		if err != nil {
			continue // gone meanwhile
		}
		// Field 19 (nice), counted from the one after the command's
		// name, which ends with the last ')'.
		fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if n, err := strconv.Atoi(fields[16]); err == nil {
			out[task.Name()] = n
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
