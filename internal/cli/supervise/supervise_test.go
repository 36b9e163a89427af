//go:build linux

package supervise

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	MaybeRunGuard()
	os.Exit(m.Run())
}

func alive(pid int) bool {
	p, ok := readProc(strconv.Itoa(pid))
	return ok && p.state != 'Z'
}

func readPid(t *testing.T, file string) int {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		b, err := os.ReadFile(file)
		if err == nil && strings.HasSuffix(string(b), "\n") {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				return pid
			}
		}
	}
	t.Fatalf("no pid in %s", file)
	return 0
}

// next returns the group's next event, failing after d.
func next(t *testing.T, g *Group, d time.Duration) Event {
	t.Helper()
	select {
	case ev := <-g.Events():
		return ev
	case <-time.After(d):
		t.Fatalf("no event after %v", d)
		return Event{}
	}
}

// start starts cmd as a Group that is ended when the test ends.
func start(t *testing.T, cmd *exec.Cmd) *Group {
	t.Helper()
	g, err := Start(cmd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { end(t, g) })
	return g
}

// end kills what is left of g, waits for Gone and reaps the guard, so the
// next test's Group is the only child of the test process.
func end(t *testing.T, g *Group) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for gone := false; !gone; {
		g.SignalAll(syscall.SIGKILL)
		select {
		case ev, ok := <-g.Events():
			gone = !ok || ev.Kind == Gone
		case <-time.After(100 * time.Millisecond):
		case <-deadline:
			t.Fatal("the group never went")
		}
	}
	guard := int(g.guardPid.Load())
	g.Close()
	if guard != 0 {
		_, _ = syscall.Wait4(guard, nil, 0, nil)
	}
}

// The leader's Pdeathsig must follow the process, not the caller's thread:
// a caller whose goroutine is locked to a thread that then exits must not
// take the command with it.
func TestCommandOutlivesCallersThread(t *testing.T) {
	type started struct {
		g   *Group
		err error
	}
	ch := make(chan started)
	go func() {
		runtime.LockOSThread() // never unlocked: this thread exits with the goroutine
		g, err := Start(exec.Command("sleep", "30"))
		ch <- started{g, err}
	}()
	s := <-ch
	if s.err != nil {
		t.Fatal(s.err)
	}
	t.Cleanup(func() { end(t, s.g) })
	time.Sleep(300 * time.Millisecond) // the caller's thread is gone by now
	if !alive(s.g.Pid()) {
		t.Fatal("the command died with the thread of the goroutine that called Start")
	}
}

// Gone comes only when every process the command started has ended,
// including one that left the group (setsid) and was re-parented to the
// supervisor; SignalAll reaches it; the guard exits on Close.
func TestGoneWaitsForReparentedDescendants(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	cmd := exec.Command("sh", "-c", fmt.Sprintf(`setsid sh -c 'echo $$ > %s; exec sleep 30' & exit 4`, pidFile))
	g := start(t, cmd)
	escaped := readPid(t, pidFile)
	if ev := next(t, g, 20*time.Second); ev.Kind != Exited || ev.Code != 4 {
		t.Fatalf("first event %+v, want Exited with code 4", ev)
	}
	select {
	case ev := <-g.Events():
		t.Fatalf("event %+v while a descendant that left the group still runs", ev)
	case <-time.After(300 * time.Millisecond):
	}
	if n := g.SignalAll(syscall.SIGKILL); n != 1 {
		t.Fatalf("SignalAll found %d processes, want the 1 that left the group", n)
	}
	ev := next(t, g, 20*time.Second)
	if ev.Kind != Gone || ev.Reaped != 1 {
		t.Fatalf("event %+v, want Gone with 1 re-parented process reaped", ev)
	}
	if alive(escaped) {
		t.Fatal("Gone while a descendant lives")
	}
	guard := int(g.guardPid.Load())
	g.Close()
	for deadline := time.Now().Add(10 * time.Second); alive(guard); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the guard %d still runs after Close", guard)
		}
	}
}

// A stopped leader is reported, and LeaderStopped tells a stale report from
// a current one.
func TestStoppedLeader(t *testing.T) {
	g := start(t, exec.Command("sh", "-c", "kill -STOP $$; exit 0"))
	if ev := next(t, g, 20*time.Second); ev.Kind != Stopped || ev.Signal != syscall.SIGSTOP || !g.LeaderStopped() {
		t.Fatalf("event %+v (leader stopped: %v), want Stopped by SIGSTOP", ev, g.LeaderStopped())
	}
	g.Continue()
	if g.LeaderStopped() {
		t.Fatal("still stopped after Continue")
	}
	if ev := next(t, g, 20*time.Second); ev.Kind != Exited || ev.Code != 0 {
		t.Fatalf("event %+v, want Exited 0", ev)
	}
}

func TestStartRefusesPipesAndASecondGroup(t *testing.T) {
	cmd := exec.Command("true")
	cmd.Stdout = &strings.Builder{}
	if _, err := Start(cmd); err == nil {
		t.Fatal("Start accepted a stdout that needs a copying goroutine")
	}
	start(t, exec.Command("sleep", "30"))
	if _, err := Start(exec.Command("true")); err == nil {
		t.Fatal("a second Group started while the first one reaps")
	}
}

func state(pid int) byte {
	p, _ := readProc(strconv.Itoa(pid))
	return p.state
}

// Stop reaches processes that left the group too, and Continue continues
// what Stop stopped but not what someone else had stopped before.
func TestStopReachesDescendantsOutsideGroup(t *testing.T) {
	dir := t.TempDir()
	running, frozen := filepath.Join(dir, "running"), filepath.Join(dir, "frozen")
	g := start(t, exec.Command("sh", "-c", fmt.Sprintf(
		`setsid sh -c 'echo $$ > %s; exec sleep 30' & setsid sh -c 'echo $$ > %s; kill -STOP $$; exec sleep 30' & exec sleep 30`, running, frozen)))
	runningPid, frozenPid := readPid(t, running), readPid(t, frozen)
	waitState := func(pid int, want func(byte) bool, what string) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !want(state(pid)); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("process %d: state %q, want %s", pid, state(pid), what)
			}
		}
	}
	isStopped := func(s byte) bool { return s == 'T' }
	notStopped := func(s byte) bool { return s != 'T' && s != 0 }
	waitState(frozenPid, isStopped, "stopped by itself")
	g.Stop()
	for _, pid := range []int{g.Pid(), runningPid} {
		waitState(pid, isStopped, "stopped by Stop")
	}
	g.Continue()
	for _, pid := range []int{g.Pid(), runningPid} {
		waitState(pid, notStopped, "continued by Continue")
	}
	time.Sleep(100 * time.Millisecond)
	if !isStopped(state(frozenPid)) {
		t.Fatal("Continue continued a process it had not stopped")
	}
}
