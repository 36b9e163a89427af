package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/cli/supervise"
)

// Tests of `fenced run` against processes that escape a naive supervisor
// (a main thread that exited while another writes, setsid), in both
// supervision modes, and of the exit after a loss. Each test logs the
// supervision mode fenced reported with -v.

// runModes are the supervision modes: the cgroup, made for real on this
// machine, and the process-tree walk, forced with supervise.ModeEnv.
var runModes = []struct{ name, env, want string }{
	{"cgroup", "", "cgroup v2"},
	{"proctree", "proctree", "process tree"},
}

// inMode runs f in each supervision mode in modes (all if none is named).
// The mode reaches each fenced f starts through its environment (cliEnv),
// not this process's, so tests in both modes can run in parallel.
func inMode(t *testing.T, f func(t *testing.T, env string), only ...string) {
	for _, m := range runModes {
		if len(only) > 0 && !strings.Contains(strings.Join(only, " "), m.name) {
			continue
		}
		t.Run(m.name, func(t *testing.T) {
			if m.env == "" && os.Getenv(supervise.ModeEnv) == "" {
				// The cgroup mode must be what this machine gives.
				if got := supervise.Probe(); !strings.HasPrefix(got, m.want) {
					t.Fatalf("supervision mode here is %q, want %s", got, m.want)
				}
			}
			testModes.Store(t.Name(), m.env)
			t.Cleanup(func() { testModes.Delete(t.Name()) })
			f(t, m.want)
		})
	}
}

// testModes maps the name of a test run by inMode to its ModeEnv value.
var testModes sync.Map

// modeOf returns the ModeEnv value inMode chose for t or a test above it.
func modeOf(t *testing.T) (string, bool) {
	for name := t.Name(); ; {
		if v, ok := testModes.Load(name); ok {
			return v.(string), true
		}
		i := strings.LastIndex(name, "/")
		if i < 0 {
			return "", false
		}
		name = name[:i]
	}
}

// checkMode fails unless fenced's -v output names the mode want, and logs it.
func checkMode(t *testing.T, errb outFile, want string) {
	t.Helper()
	var line string
	eventually(t, 20*time.Second, "fenced -v did not say its supervision mode", func() bool {
		for _, l := range strings.Split(errb.String(), "\n") {
			// partitions run puts the time before each line.
			if i := strings.Index(l, "fenced: supervision: "); i == 0 || (i > 0 && l[i-1] == ' ' && !strings.Contains(l[:i-1], " ")) {
				line = l[i:]
				return true
			}
		}
		return false
	})
	t.Logf("supervision mode: %s", strings.TrimPrefix(line, "fenced: supervision: "))
	if !strings.Contains(line, want) {
		t.Fatalf("fenced runs in mode %q, want %s", line, want)
	}
}

// mainExit compiles internal/cli/supervise/testdata/mainexit.c.
func mainExit(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "mainexit")
	if out, err := exec.Command("gcc", "-O1", "-pthread", "-o", bin, "../../internal/cli/supervise/testdata/mainexit.c").CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	return bin
}

// fileSize returns the size of file, 0 if it does not exist.
func fileSize(file string) int64 {
	fi, err := os.Stat(file)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// grows reports whether file grows within d.
func grows(file string, d time.Duration) bool {
	before := fileSize(file)
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if fileSize(file) > before {
			return true
		}
	}
	return false
}

// threadsAlive reports whether any thread of pid is alive (a process whose
// main thread exited shows as a zombie while its other threads run).
func threadsAlive(pid int) bool {
	names, _ := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/stat")
	for _, name := range names {
		b, err := os.ReadFile(name)
		if err != nil {
			continue
		}
		s := string(b)
		if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) && s[i+2] != 'Z' && s[i+2] != 'X' {
			return true
		}
	}
	return false
}

// startMainExit starts `fenced -v run ARGS... -- mainexit` writing
// "fence=$FENCED_FENCE" every 50 ms for 20 s from a process that left the
// session, ignores SIGTERM and whose main thread exited. It returns fenced,
// its stderr, the file written and the writer's pid, once the writer is a
// zombie that writes.
func startMainExit(t *testing.T, store string, args ...string) (*exec.Cmd, outFile, string, int) {
	t.Helper()
	bin := mainExit(t)
	dir := t.TempDir()
	out, pidFile := filepath.Join(dir, "out"), filepath.Join(dir, "pid")
	args = append(append([]string{"-v", "run"}, args...), "--", bin, out, pidFile, "50", "20000")
	cmd, _, errb := startRun(t, store, args...)
	pid := readPid(t, pidFile)
	eventually(t, 10*time.Second, "the writer is not a zombie: the test would prove nothing", func() bool { return procState(pid) == 'Z' })
	if !grows(out, 5*time.Second) {
		t.Fatal("the writer does not write")
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	return cmd, errb, out, pid
}

// The reproduction: after a break, a process whose main thread
// exited (and that left the session, and ignores SIGTERM) is killed after
// --grace; fenced exits 77 once it is gone, and it never writes with fence
// 1 after a new holder got fence 2.
func TestRunLossEndsMainThreadExit(t *testing.T) {
	if testing.Short() {
		t.Skip("long: a lease loss waits out a TTL; run without -short")
	}
	inMode(t, func(t *testing.T, mode string) {
		store := tempStore(t)
		cmd, errb, out, pid := startMainExit(t, store, "--ttl", "3s", "--grace", "500ms", "job:z")
		checkMode(t, errb, mode)
		adm := client(t, store)
		if _, err := adm.Break(context.Background(), "job:z", "test", "test"); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if code := waitExit(t, cmd, 15*time.Second); code != 77 {
			t.Fatalf("exit %d, want 77; stderr %s", code, errb)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Fatalf("fenced took %v to end the tree after the break (--grace 500ms)", took)
		}
		if threadsAlive(pid) {
			t.Fatalf("fenced exited 77 while the writer %d still runs", pid)
		}
		l, err := adm.TryAcquire(context.Background(), "job:z", &fenced.LeaseOptions{TTL: 5 * time.Second})
		if err != nil || l.Fence() != 2 {
			t.Fatalf("new holder: %v; want fence 2", err)
		}
		if grows(out, time.Second) {
			t.Fatal("the old holder's process writes fence=1 while fence 2 is held")
		}
	})
}

// kill -9 of fenced ends every process of COMMAND, including one that left
// the session (here also with its main thread exited). Only the cgroup can
// promise it: in process-tree mode such a process is re-parented away from
// fenced's guard (run --help says so).
func TestRunKill9EndsSetsidDescendants(t *testing.T) {
	inMode(t, func(t *testing.T, mode string) {
		store := tempStore(t)
		cmd, errb, out, pid := startMainExit(t, store, "--ttl", "2s", "job:k9")
		checkMode(t, errb, mode)
		if err := cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
		eventually(t, 10*time.Second, "a process that left the session survived kill -9 of fenced", func() bool { return !threadsAlive(pid) })
		if grows(out, 500*time.Millisecond) {
			t.Fatal("still writing after fenced died")
		}
		eventually(t, 10*time.Second, "the guard left the cgroup behind", func() bool {
			m, _ := filepath.Glob(filepath.Join(cgroup2Dir(t), "fenced-"+strconv.Itoa(cmd.Process.Pid)+"-*"))
			return len(m) == 0
		})
	}, "cgroup")
}

// Ctrl-Z (SIGTSTP to fenced) stops a process whose main thread exited too,
// and fg continues it.
func TestRunCtrlZStopsMainThreadExit(t *testing.T) {
	if testing.Short() {
		t.Skip("long: SIGTSTP past a TTL; run without -short")
	}
	inMode(t, func(t *testing.T, mode string) {
		store := tempStore(t)
		cmd, errb, out, _ := startMainExit(t, store, "--ttl", "30s", "--grace", "200ms", "job:tstp")
		checkMode(t, errb, mode)
		if err := cmd.Process.Signal(syscall.SIGTSTP); err != nil {
			t.Fatal(err)
		}
		eventually(t, 10*time.Second, "fenced did not stop", func() bool { return stopped(cmd.Process.Pid) })
		time.Sleep(100 * time.Millisecond)
		if grows(out, time.Second) {
			t.Fatal("the process whose main thread exited writes on while fenced is stopped")
		}
		if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		if !grows(out, 5*time.Second) {
			t.Fatal("not continued with fenced")
		}
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code := waitExit(t, cmd, 15*time.Second); code != 128+int(syscall.SIGTERM) {
			t.Fatalf("exit %d after SIGTERM, want 143; stderr %s", code, errb)
		}
	})
}

// cgroup2Dir returns the cgroup v2 directory of the test process, where
// fenced makes its cgroups.
func cgroup2Dir(t *testing.T) string {
	t.Helper()
	info, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	own, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	var rel string
	for _, l := range strings.Split(string(own), "\n") {
		if p, ok := strings.CutPrefix(l, "0::"); ok {
			rel = p
		}
	}
	for _, l := range strings.Split(string(info), "\n") {
		if pre, post, ok := strings.Cut(l, " - "); ok && strings.HasPrefix(post, "cgroup2 ") {
			f := strings.Fields(pre)
			return filepath.Join(f[4], strings.TrimPrefix(rel, f[3]))
		}
	}
	t.Fatal("no cgroup2 mount")
	return ""
}

// run --help and -v say which supervision mode is in effect.
func TestRunSaysSupervisionMode(t *testing.T) {
	inMode(t, func(t *testing.T, mode string) {
		r := cli(t, tempStore(t), "run", "--help")
		if !strings.Contains(r.stdout, "Supervision on this system: "+mode) || !strings.Contains(r.stdout, supervise.ModeEnv) {
			t.Fatalf("run --help does not say the mode in effect (%s):\n%s", mode, r.stdout)
		}
		t.Logf("supervision mode: %s", mode)
		r = cli(t, tempStore(t), "-v", "run", "job:mode", "--", "true")
		if r.code != 0 || !strings.Contains(r.stderr, "fenced: supervision: "+mode) {
			t.Fatalf("-v: exit %d, stderr %q; want the mode %s", r.code, r.stderr, mode)
		}
	})
}

// Where no cgroup can be made (here fenced runs in a cgroup that allows
// no child: cgroup.max.descendants 0), fenced falls back to the process
// tree, says why with -v, and still runs COMMAND and ends its tree.
func TestRunFallsBackWhenNoCgroupCanBeMade(t *testing.T) {
	dir := filepath.Join(cgroup2Dir(t), "fenced-test-"+strconv.Itoa(os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for deadline := time.Now().Add(10 * time.Second); os.Remove(dir) != nil && time.Now().Before(deadline); {
			time.Sleep(20 * time.Millisecond)
		}
	})
	if err := os.WriteFile(filepath.Join(dir, "cgroup.max.descendants"), []byte("0"), 0); err != nil {
		t.Fatal(err)
	}
	fd, err := syscall.Open(dir, syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	store := tempStore(t)
	leftover := filepath.Join(t.TempDir(), "leftover")
	cmd, _, errb := cliCmd(t, store, "-v", "run", "--grace", "200ms", "job:fallback", "--", "sh", "-c",
		"setsid sh -c 'trap \"\" TERM; echo $$ > "+leftover+"; exec sleep 30' & while [ ! -s "+leftover+" ]; do sleep 0.01; done")
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v; stderr %s", err, errb)
	}
	if !strings.Contains(errb.String(), "fenced: supervision: process tree (no cgroup: mkdir") {
		t.Fatalf("-v does not say fenced fell back to the process tree and why: %s", errb)
	}
	for _, l := range strings.Split(errb.String(), "\n") {
		if strings.Contains(l, "supervision:") {
			t.Logf("supervision mode: %s", strings.TrimPrefix(l, "fenced: supervision: "))
		}
	}
	if pid := readPid(t, leftover); alive(pid) {
		t.Fatalf("the process %d COMMAND left behind still runs", pid)
	}
}

// startCgEscape starts `fenced -v run ARGS... -- cgescape` (see
// internal/cli/supervise/testdata/cgescape.c): a process of COMMAND that moves
// itself out of fenced's cgroup, into one it makes inside it (escape
// "nested") or into another cgroup (escape "away": a sibling of fenced's,
// as the root, a systemd scope or a container's cgroup would be), then
// leaves the session, ignores SIGTERM and writes "fence=$FENCED_FENCE"
// every 50 ms from a thread after its main thread exited. It returns
// fenced, its stderr, the file written and the writer's pid, once the
// writer moved, is a zombie and writes.
func startCgEscape(t *testing.T, store, escape string, args ...string) (*exec.Cmd, outFile, string, int) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "cgescape")
	if out, err := exec.Command("gcc", "-O1", "-pthread", "-o", bin, "../../internal/cli/supervise/testdata/cgescape.c").CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	mount, own := cgroup2Paths(t)
	target := "nested"
	if escape == "away" {
		target = filepath.Join(own, "fenced-test-away-"+strconv.Itoa(os.Getpid()))
		if err := os.Mkdir(target, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			for deadline := time.Now().Add(10 * time.Second); os.Remove(target) != nil && time.Now().Before(deadline); {
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	dir := t.TempDir()
	out, pidFile := filepath.Join(dir, "out"), filepath.Join(dir, "pid")
	args = append(append([]string{"-v", "run"}, args...), "--", bin, out, pidFile, "50", "20000", mount, target)
	cmd, _, errb := startRun(t, store, args...)
	var pid int
	eventually(t, 20*time.Second, "the writer never said it moved out of fenced's cgroup", func() bool {
		b, _ := os.ReadFile(pidFile)
		s, ok := strings.CutSuffix(string(b), "\n")
		if ok && strings.HasPrefix(s, "error") {
			t.Fatalf("the writer could not move out (%s): the test would prove nothing", s)
		}
		pid, _ = strconv.Atoi(s)
		return pid != 0
	})
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	eventually(t, 10*time.Second, "the writer is not a zombie: the test would prove nothing", func() bool { return procState(pid) == 'Z' })
	if !grows(out, 5*time.Second) {
		t.Fatal("the writer does not write")
	}
	return cmd, errb, out, pid
}

// cgroup2Paths returns the cgroup2 mount point and the test process's
// cgroup directory in it.
func cgroup2Paths(t *testing.T) (mount, own string) {
	t.Helper()
	info, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(info), "\n") {
		if pre, post, ok := strings.Cut(l, " - "); ok && strings.HasPrefix(post, "cgroup2 ") {
			return strings.Fields(pre)[4], cgroup2Dir(t)
		}
	}
	t.Fatal("no cgroup2 mount")
	return "", ""
}

// writerThread returns the thread of pid that is not its main thread (0
// if there is none).
func writerThread(pid int) int {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", pid))
	for _, task := range tasks {
		if tid, _ := strconv.Atoi(filepath.Base(task)); tid != pid {
			return tid
		}
	}
	return 0
}

// procWalk reads the stat file of every process, as fenced's walk of /proc
// does, and returns how long it took.
func procWalk() time.Duration {
	start := time.Now()
	names, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, name := range names {
		_, _ = os.ReadFile(name)
	}
	return time.Since(start)
}

// fencedCgroups lists the cgroups fenced (pid) made that are left.
func fencedCgroups(t *testing.T, pid int) []string {
	m, _ := filepath.Glob(filepath.Join(cgroup2Dir(t), "fenced-"+strconv.Itoa(pid)+"-*"))
	return m
}

// The review's reproduction: a process of COMMAND that moved out of
// fenced's cgroup (into one it made inside, or into another), left the
// session and ended its main thread keeps writing with fence 1 after a
// break and a new grant (fence 2), unseen by cgroup.kill and by the
// members fenced reads. Now: fenced ends it after --grace, exits 77 once
// it is gone, and leaves no cgroup behind.
func TestRunLossEndsCgroupEscapes(t *testing.T) {
	if testing.Short() {
		t.Skip("long: a lease loss ends cgroup escapes after a TTL; run without -short")
	}
	for _, escape := range []string{"nested", "away"} {
		t.Run(escape, func(t *testing.T) {
			inMode(t, func(t *testing.T, mode string) {
				store := tempStore(t)
				cmd, errb, out, pid := startCgEscape(t, store, escape, "--ttl", "3s", "--grace", "500ms", "job:cg")
				checkMode(t, errb, mode)
				adm := client(t, store)
				if _, err := adm.Break(context.Background(), "job:cg", "test", "test"); err != nil {
					t.Fatal(err)
				}
				start := time.Now()
				code := waitExit(t, cmd, 30*time.Second)
				took := time.Since(start)
				t.Logf("fenced exited %d %v after the break", code, took)
				if threadsAlive(pid) {
					t.Errorf("fenced exited while the writer %d that left its cgroup still runs", pid)
				}
				l, err := adm.TryAcquire(context.Background(), "job:cg", &fenced.LeaseOptions{TTL: 5 * time.Second})
				if err != nil || l.Fence() != 2 {
					t.Fatalf("new holder: %v; want fence 2", err)
				}
				if grows(out, time.Second) {
					t.Error("the old holder's process writes fence=1 while fence 2 is held")
				}
				if code != 77 {
					t.Errorf("exit %d, want 77; stderr %s", code, errb)
				}
				// Bound: --grace 500ms, then SIGKILL; the old code waited 5 s
				// for a nested cgroup's parent to be removable.
				if took > 5*time.Second {
					t.Errorf("fenced took %v to end the tree after the break (--grace 500ms)", took)
				}
				if left := fencedCgroups(t, cmd.Process.Pid); len(left) > 0 {
					t.Errorf("fenced exited and left its cgroups behind: %v", left)
				}
			}, "cgroup")
		})
	}
}

// kill -9 of fenced ends a process of COMMAND that moved out of fenced's
// cgroup: one in a cgroup it made inside is killed by the guard with the
// cgroup; one that moved to another cgroup was moved back by fenced
// first (the test waits for that, and logs how long it took: a kill -9
// sooner than that misses it, as run --help says).
func TestRunKill9EndsCgroupEscapes(t *testing.T) {
	if testing.Short() {
		t.Skip("long: kill -9 of fenced ends cgroup escapes; run without -short")
	}
	for _, escape := range []string{"nested", "away"} {
		t.Run(escape, func(t *testing.T) {
			inMode(t, func(t *testing.T, mode string) {
				store := tempStore(t)
				cmd, errb, out, pid := startCgEscape(t, store, escape, "--ttl", "2s", "job:cgk9")
				checkMode(t, errb, mode)
				if escape == "away" {
					awaitMovedBack(t, cmd.Process.Pid, pid)
				}
				if err := cmd.Process.Kill(); err != nil {
					t.Fatal(err)
				}
				_ = cmd.Wait()
				eventually(t, 10*time.Second, "a process that left fenced's cgroup survived kill -9 of fenced", func() bool { return !threadsAlive(pid) })
				if grows(out, 500*time.Millisecond) {
					t.Fatal("still writing after fenced died")
				}
				eventually(t, 10*time.Second, "the guard left cgroups behind", func() bool { return len(fencedCgroups(t, cmd.Process.Pid)) == 0 })
			}, "cgroup")
		})
	}
}

// awaitMovedBack waits until fenced (or a partition's supervisor), pid
// sup, has moved the process pid, which moved itself into another cgroup,
// back into a cgroup of its own, and logs how long that took: a kill -9 of
// sup sooner misses it, as run --help says. pid's main thread may have
// exited: the cgroup read is its writing thread's.
func awaitMovedBack(t *testing.T, sup, pid int) {
	t.Helper()
	start := time.Now()
	prefix := filepath.Join(cgroup2Dir(t), "fenced-"+strconv.Itoa(sup)+"-")
	// Bound: fenced looks every 250 ms, or every 100 times the CPU time of
	// a look if longer (a look costs less than a full walk of /proc); 4
	// such pauses, with a look using as much CPU as the slowest of 3 full
	// walks measured here took time (an upper bound), leave room for a
	// look that began just before the move and for scheduling delays.
	var walk time.Duration
	for range 3 {
		walk = max(walk, procWalk())
	}
	bound := 4 * max(250*time.Millisecond, 100*walk)
	t.Logf("a walk of /proc takes %v here: fenced must move the escapee back within %v", walk, bound)
	mount, _ := cgroup2Paths(t)
	eventually(t, bound, "fenced did not move the escapee back into its cgroup", func() bool {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/cgroup", pid, writerThread(pid)))
		for _, l := range strings.Split(string(b), "\n") {
			if p, ok := strings.CutPrefix(l, "0::"); ok {
				return strings.HasPrefix(filepath.Join(mount, p), prefix)
			}
		}
		return false
	})
	t.Logf("moved back into fenced's cgroup %v after the test saw it outside", time.Since(start))
}

// A command that does not exist is reported as such ("no such file or
// directory", exit 127), in both modes; before, the start into the cgroup
// failed and was retried on the same exec.Cmd: "exec: already started".
func TestRunMissingCommandSaysSo(t *testing.T) {
	inMode(t, func(t *testing.T, mode string) {
		r := cli(t, tempStore(t), "run", "job:missing", "--", "/nonexistent/cmd")
		t.Logf("exit %d, stderr %q", r.code, r.stderr)
		if r.code != 127 || !strings.Contains(r.stderr, "/nonexistent/cmd") || !strings.Contains(r.stderr, "no such file or directory") {
			t.Fatalf("exit %d, stderr %q; want 127 and a message naming the command and saying it does not exist", r.code, r.stderr)
		}
	})
}
