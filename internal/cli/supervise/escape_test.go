//go:build linux

package supervise

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The supervision modes every test of an escape runs in: the cgroup (made
// for real on this machine) and the process-tree walk, forced by ModeEnv.
var modes = []struct{ name, env string }{{"cgroup", ""}, {"proctree", "proctree"}}

// eachMode runs f once per supervision mode, logging the mode in effect.
func eachMode(t *testing.T, f func(t *testing.T)) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Setenv(ModeEnv, m.env)
			if got := Probe(); !strings.HasPrefix(got, map[string]string{"cgroup": "cgroup v2", "proctree": "process tree"}[m.name]) {
				t.Fatalf("supervision mode %q, want %s", got, m.name)
			}
			t.Logf("supervision mode: %s", Probe())
			f(t)
		})
	}
}

// buildC compiles testdata/NAME.c into the test's temp dir.
func buildC(t *testing.T, name string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), name)
	src, err := filepath.Abs(filepath.Join("testdata", name+".c"))
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("gcc", "-O1", "-pthread", "-o", bin, src).CombinedOutput(); err != nil {
		t.Fatalf("gcc %s: %v\n%s", src, err, out)
	}
	return bin
}

// size returns the size of file, 0 if it does not exist.
func size(file string) int64 {
	fi, err := os.Stat(file)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// growing reports whether file grows within d.
func growing(file string, d time.Duration) bool {
	before := size(file)
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if size(file) > before {
			return true
		}
	}
	return false
}

// startMainExit starts testdata/mainexit.c as a Group: a descendant that
// left the session, ignores SIGTERM and writes to out from a thread after
// its main thread exited. It returns the Group, out and the writer's pid,
// once /proc shows the writer as a zombie.
func startMainExit(t *testing.T) (*Group, string, int) {
	t.Helper()
	bin := buildC(t, "mainexit")
	dir := t.TempDir()
	out, pidFile := filepath.Join(dir, "out"), filepath.Join(dir, "pid")
	g := start(t, exec.Command(bin, out, pidFile, "20", "30000"))
	t.Logf("group mode: %s", g.Mode())
	pid := readPid(t, pidFile)
	for deadline := time.Now().Add(10 * time.Second); state(pid) != 'Z'; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the writer %d is %q, not a zombie with a live thread: the test proves nothing", pid, state(pid))
		}
	}
	if !growing(out, 5*time.Second) {
		t.Fatal("the writer does not write")
	}
	return g, out, pid
}

// A process whose main thread exited (a zombie in /proc) while another
// thread writes is signalled and counted, and Gone waits for it.
func TestSignalAllReachesMainThreadExit(t *testing.T) {
	eachMode(t, func(t *testing.T) {
		g, out, pid := startMainExit(t)
		if n := g.SignalAll(syscall.SIGTERM); n != 2 { // the leader in pause(), the writer
			t.Fatalf("SignalAll found %d living processes, want 2 (the writer %d is alive)", n, pid)
		}
		select {
		case ev := <-g.Events():
			if ev.Kind != Exited {
				t.Fatalf("event %+v after SIGTERM, want the leader's exit", ev)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the leader did not exit on SIGTERM")
		}
		g.SignalAll(syscall.SIGKILL)
		ev := next(t, g, 10*time.Second)
		if ev.Kind != Gone {
			t.Fatalf("event %+v after SIGKILL, want Gone", ev)
		}
		if livingThreads(pid) > 0 || growing(out, 300*time.Millisecond) {
			t.Fatalf("Gone while the writer %d still writes", pid)
		}
	})
}

// Stop stops such a process too, and Continue continues it.
func TestStopHoldsMainThreadExit(t *testing.T) {
	eachMode(t, func(t *testing.T) {
		g, out, _ := startMainExit(t)
		g.Stop()
		time.Sleep(50 * time.Millisecond)
		if growing(out, 500*time.Millisecond) {
			t.Fatal("the writer writes on while the Group is stopped")
		}
		g.Continue()
		if !growing(out, 5*time.Second) {
			t.Fatal("the writer was not continued")
		}
	})
}

// Close before Gone (a panic unwinding through the supervisor) kills the
// whole tree, including a process that left the group, instead of telling
// the guard all is done.
func TestCloseBeforeGoneKillsTree(t *testing.T) {
	eachMode(t, func(t *testing.T) {
		g, out, pid := startMainExit(t)
		func() {
			defer func() { _ = recover() }()
			defer g.Close()
			panic("supervision loop")
		}()
		for deadline := time.Now().Add(10 * time.Second); livingThreads(pid) > 0; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the writer %d still runs 10s after Close before Gone", pid)
			}
		}
		if growing(out, 300*time.Millisecond) {
			t.Fatal("still writing")
		}
		if ev := next(t, g, 10*time.Second); ev.Kind != Exited {
			t.Fatalf("event %+v, want the leader's exit", ev)
		}
		if ev := next(t, g, 10*time.Second); ev.Kind != Gone {
			t.Fatalf("event %+v, want Gone", ev)
		}
	})
}

// Stop holds a process that keeps forking and exiting (each time leaving
// the session): one scan for processes finds a process that is gone by the
// time it is stopped, while its child runs on. In the cgroup, Stop freezes
// them all at once. Only the cgroup mode is tested: the process-tree walk
// rescans until stable, but a hopper can outrun any walk of /proc, and
// this one sometimes did on this machine even at one hop per 2 ms.
func TestStopHoldsAHopper(t *testing.T) {
	if testing.Short() {
		t.Skip("long: a process hopping out of the session for seconds; run without -short")
	}
	t.Setenv(ModeEnv, "")
	t.Logf("supervision mode: %s", Probe())
	{
		bin := buildC(t, "hopper")
		out := filepath.Join(t.TempDir(), "out")
		g := start(t, exec.Command(bin, out, "300"))
		if !growing(out, 5*time.Second) {
			t.Fatal("the hopper does not run")
		}
		for i := range 10 {
			g.Stop()
			time.Sleep(20 * time.Millisecond)
			if growing(out, 300*time.Millisecond) {
				t.Fatalf("stop %d: the hopper runs on while the Group is stopped", i)
			}
			g.Continue()
			if !growing(out, 5*time.Second) {
				t.Fatalf("continue %d: the hopper was not continued", i)
			}
		}
	}
}
