//go:build linux

package supervise

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Tests of processes that leave the Group's cgroup by writing their pid
// into another cgroup's cgroup.procs (testdata/cgescape.c): into a cgroup
// they make inside the Group's own ("nested", allowed wherever the cgroup
// is delegated), or into another cgroup outside it ("away": here a sibling
// the test makes; the root, a systemd scope, a container's cgroup are the
// same case). Each escapee also leaves the session and ends its main
// thread, so cgroup.procs and cgroup.kill miss it.

// escapes are the two ways out of the cgroup.
var escapes = []string{"nested", "away"}

// awayCgroup makes a cgroup beside the ones Start makes (a child of the
// test process's cgroup), removed when the test ends.
func awayCgroup(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(cgroupParent(t), "fenced-test-away-"+strconv.Itoa(os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := (&cgroup{dir: dir}).remove(10 * time.Second); err != nil {
			t.Error(err)
		}
	})
	return dir
}

// startEscapee starts cgescape as a Group in cgroup mode, the escapee
// moving out as escape says. It returns the Group, the file the escapee
// writes and its pid, once it has moved, is a zombie with a live thread,
// and writes, after calling each of onPid with its pid as soon as it says
// it moved.
func startEscapee(t *testing.T, escape string, onPid ...func(int)) (*Group, string, int) {
	t.Helper()
	t.Setenv(ModeEnv, "")
	bin := buildC(t, "cgescape")
	mount, _, err := cgroup2Mount()
	if err != nil {
		t.Fatal(err)
	}
	target := "nested"
	if escape == "away" {
		target = awayCgroup(t)
	}
	dir := t.TempDir()
	out, pidFile := filepath.Join(dir, "out"), filepath.Join(dir, "pid")
	g := start(t, exec.Command(bin, out, pidFile, "20", "30000", mount, target))
	if !strings.HasPrefix(g.Mode(), "cgroup v2") {
		t.Fatalf("not in cgroup mode: %s", g.Mode())
	}
	t.Logf("supervision mode: %s", g.Mode())
	var pid int
	for deadline := time.Now().Add(20 * time.Second); pid == 0; time.Sleep(10 * time.Millisecond) {
		b, _ := os.ReadFile(pidFile)
		if s, ok := strings.CutSuffix(string(b), "\n"); ok {
			if pid, err = strconv.Atoi(s); err != nil {
				t.Fatalf("the escapee did not move out (%s): the test proves nothing", s)
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the escapee never said it moved out")
		}
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	for _, f := range onPid {
		f(pid)
	}
	for deadline := time.Now().Add(10 * time.Second); state(pid) != 'Z'; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the escapee %d is %q, not a zombie with a live thread: the test proves nothing", pid, state(pid))
		}
	}
	if !growing(out, 5*time.Second) {
		t.Fatal("the escapee does not write")
	}
	return g, out, pid
}

// SignalAll finds and kills a process that left the cgroup, Gone waits for
// it, and the cgroup (with the one the command made inside it) is removed
// by Gone, at once.
func TestSignalAllReachesCgroupEscapes(t *testing.T) {
	for _, escape := range escapes {
		t.Run(escape, func(t *testing.T) {
			g, out, pid := startEscapee(t, escape)
			if n := g.SignalAll(syscall.SIGTERM); n != 2 { // the leader in pause(), the escapee
				t.Errorf("SignalAll found %d living processes, want 2 (the escapee %d is alive)", n, pid)
			}
			if ev := next(t, g, 10*time.Second); ev.Kind != Exited {
				t.Fatalf("event %+v after SIGTERM, want the leader's exit", ev)
			}
			dir := g.cg.dir
			killed := time.Now()
			g.SignalAll(syscall.SIGKILL)
			ev := next(t, g, 20*time.Second)
			t.Logf("Gone %v after SIGKILL", time.Since(killed))
			if ev.Kind != Gone {
				t.Fatalf("event %+v after SIGKILL, want Gone", ev)
			}
			if livingThreads(pid) > 0 || growing(out, 300*time.Millisecond) {
				t.Fatalf("Gone while the escapee %d still writes", pid)
			}
			if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("Gone, and the cgroup %s is left behind (%v)", dir, err)
			}
		})
	}
}

// Stop holds a process that left the cgroup, and Continue continues it.
func TestStopHoldsCgroupEscapes(t *testing.T) {
	for _, escape := range escapes {
		t.Run(escape, func(t *testing.T) {
			g, out, pid := startEscapee(t, escape)
			g.Stop()
			time.Sleep(50 * time.Millisecond)
			if growing(out, 500*time.Millisecond) {
				t.Fatalf("the escapee %d writes on while the Group is stopped", pid)
			}
			g.Continue()
			if !growing(out, 5*time.Second) {
				t.Fatal("the escapee was not continued")
			}
		})
	}
}

// A process that moved to a cgroup outside is moved back into the Group's
// cgroup without any call, by the Group's watch, so that the guard, which
// knows only the cgroup, reaches it if the supervisor is killed (kill -9).
func TestWatchBringsBackCgroupEscapes(t *testing.T) {
	var moved time.Duration
	g, _, pid := startEscapee(t, "away", func(pid int) {
		reported := time.Now() // the escapee had moved out by now
		// Bound: the watch pauses 250 ms, or 100 times the CPU time of a
		// round if longer (a round costs less than a full walk of /proc);
		// 4 such pauses, with a round using as much CPU as the slowest of
		// 3 full walks measured here took time (an upper bound), leave
		// room for a round that began just before the move and for the
		// scheduling delays of a loaded machine.
		var walk time.Duration
		for range 3 {
			start := time.Now()
			readProcs()
			walk = max(walk, time.Since(start))
		}
		bound := 4 * max(250*time.Millisecond, 100*walk)
		for !inCgroup(t, pid, cgroupParent(t)+"/fenced-"+strconv.Itoa(os.Getpid())+"-") {
			if time.Since(reported) > bound {
				t.Fatalf("the escapee %d is still outside the Group's cgroup %v after it moved out (bound %v: a walk of /proc took %v)", pid, time.Since(reported), bound, walk)
			}
			time.Sleep(time.Millisecond)
		}
		moved = time.Since(reported)
	})
	if !inCgroup(t, pid, g.cg.dir) {
		t.Fatalf("the escapee %d is not in the Group's cgroup %s", pid, g.cg.dir)
	}
	t.Logf("moved back within %v of the escapee's report that it moved out", moved)
}

// inCgroup reports whether every living thread of process pid is in the
// cgroup directory dir or nested in it, or, dir not ending in a full name,
// in one whose path begins with dir. (/proc/PID/cgroup will not do: a
// main thread that exited keeps showing the cgroup it died in.)
func inCgroup(t *testing.T, pid int, dir string) bool {
	t.Helper()
	mount, root, err := cgroup2Mount()
	if err != nil {
		t.Fatal(err)
	}
	tasks, _ := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*")
	living := 0
	for _, task := range tasks {
		st, _ := os.ReadFile(task + "/stat")
		if i := strings.LastIndexByte(string(st), ')'); i < 0 || i+2 >= len(st) || st[i+2] == 'Z' {
			continue
		}
		b, _ := os.ReadFile(task + "/cgroup")
		for _, l := range strings.Split(string(b), "\n") {
			if p, ok := strings.CutPrefix(l, "0::"); ok {
				if !strings.HasPrefix(filepath.Join(mount, strings.TrimPrefix(p, root)), dir) {
					return false
				}
				living++
			}
		}
	}
	return living > 0
}

// A command that cannot be started is reported as cmd.Start reports it
// (not "exec: already started", from a second Start of the same exec.Cmd
// after the start into the cgroup failed), nothing is left behind, and the
// next Group starts.
func TestStartReportsMissingCommand(t *testing.T) {
	eachMode(t, func(t *testing.T) {
		cmd := exec.Command("/nonexistent/cmd")
		g, err := Start(cmd)
		if err == nil {
			end(t, g)
			t.Fatal("a missing command started")
		}
		if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "/nonexistent/cmd") || errors.Is(err, ErrSetup) {
			t.Fatalf("Start of a missing command: %v; want cmd.Start's error, naming it and saying it does not exist", err)
		}
		t.Logf("Start: %v", err)
		m, _ := filepath.Glob(filepath.Join(cgroupParent(t), "fenced-"+strconv.Itoa(os.Getpid())+"-*"))
		if len(m) > 0 {
			t.Fatalf("cgroups left behind: %v", m)
		}
		start(t, exec.Command("true"))
	})
}

// cgroupParent returns the directory in which Start makes its cgroups.
func cgroupParent(t *testing.T) string {
	t.Helper()
	mount, root, err := cgroup2Mount()
	if err != nil {
		t.Fatal(err)
	}
	own, err := ownCgroup()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(mount, strings.TrimPrefix(own, root))
}
