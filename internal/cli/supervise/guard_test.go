package supervise

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestKillByKillsUnlessMoved checks the guard's deadline: a tree whose
// deadline keeps moving ahead runs on past every earlier one; once it
// stops moving, the guard kills the tree by itself, the supervisor doing
// nothing.
func TestKillByKillsUnlessMoved(t *testing.T) {
	const step = 300 * time.Millisecond
	g, err := StartKillBy(exec.Command("sleep", "60"), time.Now().Add(step))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { end(t, g) })
	var last time.Time
	for range 10 {
		last = time.Now().Add(step)
		g.KillBy(last)
		time.Sleep(step / 3)
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
	t.Logf("the guard killed the tree %v after its last deadline", took.Round(time.Millisecond))
}

// TestGuardNice checks that every thread of the guard has a nice of
// guardNice where the process may raise its priority (as root), and its
// own (0) otherwise.
func TestGuardNice(t *testing.T) {
	g := start(t, exec.Command("sleep", "60"))
	want := 0
	if os.Geteuid() == 0 {
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
	far := time.Now().Add(time.Hour)
	// A pipe holds 64 KiB (Linux's default); an order is under 32 bytes.
	// So the first few thousand fill it, and the last 200 find it full.
	n := 65536/len(fmt.Sprintf("kill-by %d\n", boottime())) + 200
	for i := range n {
		began := time.Now()
		g.KillBy(far)
		// A second is a hundred times guardWriteWait: what is checked is
		// that a full pipe does not hold the supervisor, not how fast.
		if took := time.Since(began); took > time.Second {
			t.Fatalf("order %d of %d to a stopped guard took %v", i+1, n, took)
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
