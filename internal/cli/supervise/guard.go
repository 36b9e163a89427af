package supervise

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fenced-dev/fenced/clock"
)

// guardEnv carries nothing but marks a guard process (see MaybeRunGuard).
const guardEnv = "FENCED_SUPERVISE_GUARD"

// TraceEnv is a variable that, when set, has a guard that killed the tree
// say on its stderr when it acted, when its first kill was done, when the
// tree was gone, and its last deadline, for tests that time a supervisor's
// death.
const TraceEnv = "FENCED_SUPERVISE_TRACE"

// monotonic returns CLOCK_MONOTONIC in nanoseconds, which every process
// on the host reads alike.
func monotonic() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// boottime returns CLOCK_BOOTTIME in nanoseconds: as monotonic, with the
// time the machine spent suspended.
func boottime() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts)
	return ts.Nano()
}

// guardNice is the nice value the guard's threads ask for where a
// real-time policy is refused.
const guardNice = -10

// guardPolicy is the scheduling policy the guard's threads ask for first:
// round-robin real time at the lowest priority. A woken real-time thread
// runs ahead of every ordinary one; a nice value only weighs the guard
// within its session's share (autogroups), and under the hog the guard
// woke up to 805 ms past its deadline at nice -10. The guard sleeps in
// poll until it must act, then kills and exits, so it holds no CPU long;
// the kernel keeps real time to 95% of each second besides.
var guardPolicy = unix.SchedAttr{Policy: unix.SCHED_RR, Priority: 1}

// raisePriority gives every thread of the guard guardPolicy where
// permitted (root, CAP_SYS_NICE or RLIMIT_RTPRIO), else a nice of
// guardNice where permitted, and keeps its own otherwise. Linux keeps
// both per thread, and a new thread starts with its creator's, so the
// threads made later have them too.
func raisePriority() {
	tasks, _ := os.ReadDir("/proc/self/task")
	for _, task := range tasks {
		tid, err := strconv.Atoi(task.Name())
		if err != nil {
			continue
		}
		attr := guardPolicy
		if unix.SchedSetAttr(tid, &attr, 0) != nil {
			_ = unix.Setpriority(unix.PRIO_PROCESS, tid, guardNice)
		}
	}
}

// guardHolds are the files every guard started from now on inherits.
var guardHolds []*os.File

// GuardHolds makes every guard started after it inherit f, open until the
// guard exits. A guard exits once the tree is gone: at "done", or after
// killing what the supervisor left. So whoever reads the pipe f writes to
// learns, at its end of file, that the tree of a dead supervisor is gone
// too. f must be close-on-exec in this process, so the command does not
// inherit it.
func GuardHolds(f *os.File) { guardHolds = append(guardHolds, f) }

// startGuard starts the guard: this binary again, reading its orders from a
// pipe. It is in a process group of its own (no terminal signals reach it)
// and is not the command's descendant, so ending the tree spares it. It
// shares the supervisor's stderr, to say why it killed the tree.
func (g *Group) startGuard() error {
	r, w, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("%w: guard pipe: %v", ErrSetup, err)
	}
	defer r.Close()
	guard := &exec.Cmd{
		Path:        "/proc/self/exe", // this binary, even if replaced on disk since
		Args:        []string{os.Args[0] + " (guard)"},
		Env:         append(os.Environ(), guardEnv+"=1"),
		Stdin:       r,
		Stderr:      os.Stderr,
		ExtraFiles:  guardHolds,
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
	}
	if err := guard.Start(); err != nil {
		w.Close()
		return fmt.Errorf("%w: start the guard process: %v", ErrSetup, err)
	}
	g.guardPid.Store(int64(guard.Process.Pid))
	_ = guard.Process.Release() // reaped by reap, by pid
	g.guardW = w
	return nil
}

// guardWriteWait bounds how long a line to the guard may wait for room in
// its pipe. A guard that does not read (stopped with SIGSTOP) fills the
// pipe after a few thousand orders; the supervisor must not block on it.
// A line dropped leaves the guard its earlier order, whose deadline is
// sooner, never later.
const guardWriteWait = 10 * time.Millisecond

// tellGuard writes line, one order, to the guard's pipe: all of it or
// none (a pipe writes up to PIPE_BUF bytes at once), waiting at most
// guardWriteWait.
func (g *Group) tellGuard(line string) {
	g.guardMu.Lock()
	defer g.guardMu.Unlock()
	if g.guardW != nil {
		_ = g.guardW.SetWriteDeadline(time.Now().Add(guardWriteWait))
		_, _ = io.WriteString(g.guardW, line)
	}
}

// KillBy has the guard kill the whole tree at t (comparable with
// time.Now), as it does when the supervisor dies, unless a later call
// moves t first. A supervisor holding a lease for the command calls it
// with the moment it would kill an unrenewed tree itself, and again after
// each renewal: then a supervisor stopped (SIGSTOP), starved, or slow to
// die (the kernel closes a killed process's files only after freeing its
// memory, and the guard learns of the death from its pipe) does not let
// the tree outlive the lease. The guard's clock counts time suspended.
// Without a call the guard waits for the supervisor's death alone; a zero
// t changes nothing.
func (g *Group) KillBy(t time.Time) {
	if t.IsZero() {
		return
	}
	g.tellGuard(fmt.Sprintf("kill-by %d\n", boottime()+int64(time.Until(t))))
}

// guardOrders is what a guard has been told.
type guardOrders struct {
	group  int
	cg     *cgroup
	killBy int64 // CLOCK_BOOTTIME ns; 0 for none
}

// apply takes one line from the supervisor. It reports false at "done".
// It allocates only for a cgroup's name (once): see awaitEnd.
func (o *guardOrders) apply(line []byte) bool {
	if arg, ok := bytes.CutPrefix(line, []byte("kill-by ")); ok {
		if t, ok := parseDecimal(arg); ok {
			o.killBy = t
		}
		return true
	}
	switch arg, ok := bytes.CutPrefix(line, []byte("group ")); {
	case ok:
		if g, ok := parseDecimal(arg); ok {
			o.group = int(g)
		}
	case bytes.Equal(line, []byte("done")):
		return false
	case bytes.HasPrefix(line, []byte("cgroup ")):
		o.cg = &cgroup{dir: string(line[len("cgroup "):])}
	}
	return true
}

// parseDecimal parses b, a non-negative decimal number, without
// allocating (strconv's errors hold a copy of their input).
func parseDecimal(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 18 {
		return 0, false
	}
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

// awaitEnd reads the supervisor's orders from fd until the supervisor
// says "done" (then the guard exits at once), its pipe closes, or the
// moment of the last "kill-by" passes with no newer order in the pipe
// (late). It polls at least every clock.MaxTimerStep, so a moment that
// passed while the machine was suspended is seen within that step. It
// allocates nothing per order, so the garbage collector, off in the
// guard (see stopCollecting), never has to run meanwhile.
func awaitEnd(fd int) (o guardOrders, late bool) {
	var buf [8192]byte
	held := 0 // bytes of buf holding an order not yet whole
	// read takes what the pipe holds; it reports false at end of file.
	read := func() bool {
		n, err := unix.Read(fd, buf[held:])
		if n <= 0 {
			return err == unix.EINTR || err == unix.EAGAIN
		}
		held += n
		start := 0
		for {
			i := bytes.IndexByte(buf[start:held], '\n')
			if i < 0 {
				break
			}
			if !o.apply(buf[start : start+i]) {
				os.Exit(0)
			}
			start += i + 1
		}
		held = copy(buf[:], buf[start:held])
		if held == len(buf) {
			held = 0 // no order is this long: drop it
		}
		return true
	}
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		wait := -1
		if o.killBy != 0 {
			left := time.Duration(o.killBy - boottime())
			if left <= 0 {
				// A newer order already in the pipe comes first.
				if n, _ := unix.Poll(fds, 0); n > 0 {
					if !read() {
						return o, false
					}
					continue
				}
				return o, true
			}
			wait = int(min(left, clock.MaxTimerStep).Milliseconds()) + 1
		}
		n, err := unix.Poll(fds, wait)
		if err != nil && err != unix.EINTR {
			return o, false // the pipe is unusable: as if the supervisor died
		}
		if n > 0 && !read() {
			return o, false
		}
	}
}

// stopCollecting collects what starting up left, then turns the garbage
// collector off, with a memory limit 64 MiB above what the process holds
// as a safety valve. A cycle that starts while the guard waits can hold
// it well past its deadline once woken: under load a race-built guard
// woke 80 ms-1.7 s late in 9 of 35 waits with the collector on, and
// within 1.3 ms in 16 of 16 with it off. The wait allocates nothing.
func stopCollecting() {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	debug.SetMemoryLimit(int64(m.Sys-m.HeapReleased) + 64<<20)
	debug.SetGCPercent(-1)
}

// MaybeRunGuard runs the guard and exits if this process was started as a
// Group's guard. Otherwise it returns at once. Programs that use Start must
// call it first in main (and tests in TestMain).
//
// The guard ignores job-control and termination signals. It reads "group N"
// and, in cgroup mode, "cgroup DIR", and then waits. When its pipe closes
// without "done", the supervisor has died (or gave up before the tree was
// gone); when the moment of the last KillBy passes, the supervisor did not
// run in time. Either way the guard kills the cgroup with cgroup.kill. That
// reaches every process in it and in the cgroups nested in it, wherever it
// moved in the process tree, and each process listed in their
// cgroup.threads. It also sends SIGKILL to group N. It repeats both until
// both are empty (at most a few seconds), removes the cgroups, and exits.
func MaybeRunGuard() {
	if os.Getenv(guardEnv) == "" {
		return
	}
	// The guard works on its main thread, whose ID is its process ID: a
	// tracer attached to that one thread (a test delays its kill with
	// strace -p) sees every call it makes.
	runtime.LockOSThread()
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGTSTP,
		syscall.SIGTTIN, syscall.SIGTTOU, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGPIPE)
	// The collection before the priority: at real time it would hold a
	// CPU from every other process (and from the other guards) as it ran.
	stopCollecting()
	raisePriority()
	var before, after unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_SELF, &before)
	o, late := awaitEnd(int(os.Stdin.Fd()))
	acted, woke := monotonic(), boottime()
	killed := int64(0)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		left := false
		if o.cg != nil && o.cg.populated() {
			o.cg.killAll()
			left = true
		}
		if o.group > 1 && !errors.Is(unix.Kill(-o.group, syscall.SIGKILL), syscall.ESRCH) {
			left = true
		}
		if killed == 0 {
			killed = monotonic()
		}
		if !left {
			break
		}
	}
	_ = unix.Getrusage(unix.RUSAGE_SELF, &after) // after the kill: nothing delays it
	if late {
		fmt.Fprintln(os.Stderr, "fenced: fenced did not end COMMAND by the moment it had set for an unrenewed lease or a --grace "+
			"(it was stopped, or the machine too busy): its guard killed every process of COMMAND")
	}
	if os.Getenv(TraceEnv) != "" {
		fmt.Fprintf(os.Stderr, "supervise guard: acted at %d, first kill done at %d, tree gone at %d (CLOCK_MONOTONIC ns); "+
			"deadline %d, woke at %d (CLOCK_BOOTTIME ns); %d major page faults as it waited, woke and killed\n",
			acted, killed, monotonic(), o.killBy, woke, after.Majflt-before.Majflt)
	}
	if o.cg != nil {
		_ = o.cg.remove(5 * time.Second)
	}
	os.Exit(0)
}
