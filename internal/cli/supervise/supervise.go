//go:build linux

// Package supervise runs a command as a supervised job: in a process group of
// its own and, where the system allows it, in a cgroup of its own, with every
// process it starts kept under the supervisor, so that the supervisor can
// stop, continue and end all of it, and know when none of it is left.
// `fenced run` is built on it.
//
// Two modes (Group.Mode and Probe say which is in effect):
//
//   - cgroup: Start makes a cgroup v2 child of the cgroup the supervisor runs
//     in (found from /proc/self/mountinfo and /proc/self/cgroup; no
//     controller is needed) and starts the command into it
//     (CLONE_INTO_CGROUP, so it is inside before it runs). No setsid, double
//     fork or exited main thread leaves it: SIGKILL goes through cgroup.kill
//     (and to each process listed in cgroup.threads, since cgroup.kill and
//     cgroup.procs miss a process whose main thread exited while others
//     run), Stop freezes it (cgroup.freeze), and Gone also waits for
//     cgroup.events to say "populated 0". Cgroups the command makes inside
//     it (where it is delegated, any process may) are part of it: their
//     threads are listed too, and they are removed with it, deepest first.
//     A process that writes its pid into another cgroup's cgroup.procs (the
//     root's, a sibling's, a systemd scope's: wherever it may) is still the
//     supervisor's descendant, as the supervisor is a child subreaper: it is
//     found by a walk of /proc and moved back into the cgroup (where that is
//     refused, for want of permission or because the cgroup may hold no
//     process, it is signalled and stopped by pid, as in process-tree mode).
//     SignalAll and Stop move such processes back (after acting on the
//     cgroup), and the Group watches for them all the time (see the
//     guarantees below). The cgroup
//     is removed after Gone, or by the guard if the supervisor died.
//   - process tree, where no cgroup can be made (no cgroup v2, no permission
//     or delegation, or a kernel before 5.14, which lacks cgroup.kill), or
//     when ModeEnv forces it for tests: processes are found by walking /proc
//     from the supervisor, counting a process as living by its threads
//     (/proc/PID/task), so a zombie main thread does not hide a running
//     process, and scanning again until the scan is stable. A process that
//     forks and exits faster than a walk of /proc can outrun it, and a
//     process that left the group survives a kill -9 of the supervisor.
//
// What a Group guarantees, and how:
//
//   - Every descendant stays countable. Start makes the calling process a
//     child subreaper (PR_SET_CHILD_SUBREAPER): a process whose parent exits
//     is re-parented to the supervisor instead of init, so "the supervisor
//     has no child left" means "no process the command started is left",
//     including processes that left the group (setsid, double forks). The
//     Group reaps them all (wait4 on any child) and reports Gone once none
//     is left (and, in cgroup mode, the cgroup is empty).
//   - The whole tree can be signalled. SignalAll signals the process group
//     and every process of the cgroup (and those that left it, moved back
//     into it), or every descendant found in /proc, so processes that left
//     the group are not missed.
//   - The command dies with the supervisor. The command's leader gets
//     Pdeathsig SIGKILL. The kernel sends Pdeathsig when the *thread* that
//     forked the child exits, not the process (go.dev/issue/27505), so the
//     child is forked from a goroutine locked to its OS thread that stays
//     locked (reaping) until the tree is gone. The rest of the tree is ended
//     by a guard process (the supervisor's own binary, re-executed; see
//     MaybeRunGuard) that waits on a pipe from the supervisor and, when the
//     pipe closes without a goodbye (the supervisor died, or Close was
//     called before Gone, as a panic unwinding does), kills the cgroup
//     (with the cgroups nested in it) and the group. Once the supervisor is
//     gone, its descendants outside the cgroup are re-parented away from it
//     and nothing marks them as the command's any more, so the guard misses:
//     in process-tree mode, every process that left the group; in cgroup
//     mode, a process that moved to another cgroup less than one watch pause
//     before the supervisor died (the Group looks for such processes and
//     moves them back every 250 ms, or every 100 times the CPU time a look
//     takes if that is longer, so that watching costs at most about 1% of
//     a CPU; see watch), or one that cannot be moved back.
//   - Interactive commands keep the terminal. If the command's stdin is the
//     caller's controlling terminal and the caller's group is in its
//     foreground, the command's group is put in the foreground as it starts
//     (before exec, so its first read cannot race). The caller takes it back
//     with TakeTerminal or Stop, and Continue gives it to the command again
//     whenever the caller is in the foreground by then (a job started in the
//     background and brought to the foreground with fg gets it too).
//     tcsetpgrp from a background group raises SIGTTOU, so the Group blocks
//     SIGTTOU on its own thread around the call.
//
// What no mode covers: a process the command has someone else start
// (systemd-run without --scope, at, a container daemon, ssh) is not its
// descendant and never was in its cgroup; a supervisor stopped with
// SIGSTOP watches nothing; and a command with the privilege to act on the
// supervisor, the guard or their cgroups (kill or ptrace them, thaw the
// cgroup, enable a controller in its subtree_control so that no process may
// be moved back into it) can undo any of this.
//
// Processes are found by scanning /proc (or the cgroup's files); a process
// id read there could in theory be reused between the scan and the kill
// (or the move back into the cgroup), but only after the process was
// reaped by this Group or by another of the command's processes, which
// makes that window a few microseconds long on a pid space that must wrap
// around first.
package supervise

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// EventKind says what happened to a supervised command.
type EventKind int

const (
	// Stopped: the command's leader (the process Start started) was
	// stopped, by job control (SIGTSTP, SIGTTIN, SIGTTOU) or SIGSTOP.
	// Signal is the stop signal.
	Stopped EventKind = iota + 1
	// Exited: the leader exited or was killed. Code is its exit code, or
	// 128+N if signal N killed it (then Signal is N).
	Exited
	// Gone: no process the command started is left, whether in its group
	// or not. It is the last event.
	Gone
)

// Event is a change of state of a supervised command.
type Event struct {
	Kind   EventKind
	Code   int            // Exited: the exit code (128+N for signal N)
	Signal syscall.Signal // Stopped: the stop signal; Exited: the killing signal or 0
	// Reaped is, with Gone, how many processes other than the leader were
	// re-parented to the supervisor and reaped by it.
	Reaped int
}

// Group is a command started by Start. Its methods may be called from any
// goroutine.
type Group struct {
	cmd    *exec.Cmd
	pid    int // the leader's pid, which is also the group's id
	self   int
	tty    int // the caller's controlling terminal if it is the command's stdin, or -1
	events chan Event

	stopMu  sync.Mutex
	stopped []int // processes outside the group that Stop stopped

	cg      *cgroup       // the command's cgroup, or nil in process-tree mode
	mode    string        // the supervision mode, for Mode
	unwatch chan struct{} // closed to end watch (cgroup mode)
	linMu   sync.Mutex
	lin     lineage // the supervisor's descendants, for gather and watch
	// moveMu keeps watch's moves out of SignalAll: a process moved back
	// between its cgroup pass and its gather would be missed by both.
	// watch holds it for one move, so SignalAll waits for one at most.
	moveMu sync.Mutex

	goneFlag atomic.Bool  // Gone was reported
	exits    atomic.Int64 // children reaped so far, for eachLiving

	guardPid atomic.Int64 // 0 once the guard is gone (or never ran)
	guardMu  sync.Mutex
	guardW   *os.File // the guard's pipe; nil after Close
	reaped   int      // touched only by the reaping goroutine
}

// ErrSetup marks a failure of Start's own setup (the subreaper, the guard).
// It is as opposed to a command that could not be started. Either way
// nothing ran.
var ErrSetup = errors.New("supervise: cannot supervise")

var (
	subreaperOnce sync.Once
	subreaperErr  error
	active        atomic.Bool // a Group is being reaped
)

// Start starts cmd in a new process group of its own and supervises it.
//
// cmd must not have been started. Its Stdin, Stdout and Stderr must be nil
// or *os.File: Start reaps the process itself, and cmd.Wait must not be
// called (nothing would copy a pipe). Start sets in cmd.SysProcAttr:
// Setpgid, Pdeathsig SIGKILL, and Foreground with Ctty when the terminal is
// handed over. Other fields are kept.
//
// Start makes the whole calling process a child subreaper. The Group reaps
// every child of the process (wait4(-1)). So a process that supervises a
// Group must not start and Wait for other children of its own meanwhile.
// Only one Group can run at a time: Start fails with ErrSetup until the
// previous one reported Gone.
//
// Errors from starting the command are returned as cmd.Start returns them.
// A failure of the supervision itself matches ErrSetup. If the command
// cannot be started into its cgroup, Start drops the cgroup. It starts the
// command again in process-tree mode, from a copy of cmd (an exec.Cmd
// cannot be started twice). It then sets cmd.Process, as cmd.Start would,
// but a context given with exec.CommandContext is not carried over.
func Start(cmd *exec.Cmd) (*Group, error) { return StartKillBy(cmd, time.Time{}) }

// StartKillBy is Start with the guard told to kill the tree at killBy
// (see KillBy) before the command runs, so that no moment of the command
// goes without that bound. A zero killBy sets none.
func StartKillBy(cmd *exec.Cmd, killBy time.Time) (*Group, error) {
	for _, s := range []any{cmd.Stdin, cmd.Stdout, cmd.Stderr} {
		if _, ok := s.(*os.File); s != nil && !ok {
			return nil, fmt.Errorf("supervise: stdio must be nil or *os.File, got %T", s)
		}
	}
	subreaperOnce.Do(func() {
		subreaperErr = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	})
	if subreaperErr != nil {
		return nil, fmt.Errorf("%w: become a child subreaper: %v", ErrSetup, subreaperErr)
	}
	if !active.CompareAndSwap(false, true) {
		return nil, fmt.Errorf("%w: another Group of this process is still running", ErrSetup)
	}
	g := &Group{cmd: cmd, self: os.Getpid(), tty: -1, events: make(chan Event, 16)}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	attr := cmd.SysProcAttr
	attr.Setpgid, attr.Pgid = true, 0
	attr.Pdeathsig = syscall.SIGKILL
	if os.Getenv(ModeEnv) == "proctree" {
		g.mode = procTreeMode(ModeEnv + "=proctree")
	} else if cg, err := newCgroup(); err != nil {
		g.mode = procTreeMode(err.Error())
	} else {
		g.cg, g.mode = cg, cgroupMode(filepath.Dir(cg.dir))
	}
	if f, ok := cmd.Stdin.(*os.File); ok && f != nil {
		// TIOCGPGRP succeeds only on the caller's controlling terminal.
		fd := int(f.Fd())
		if fg, err := unix.IoctlGetInt(fd, unix.TIOCGPGRP); err == nil {
			g.tty = fd
			if fg == unix.Getpgrp() { // started in the foreground
				attr.Foreground, attr.Ctty = true, fd
			}
		}
	}

	started := make(chan error, 1)
	go func() {
		// The thread that forks the child must outlive it (Pdeathsig), so
		// this goroutine keeps its thread locked and reaps until the tree
		// is gone. It never unlocks: the runtime then ends the thread when
		// the goroutine returns, which is harmless once no child is left.
		runtime.LockOSThread()
		if err := g.startGuard(); err != nil {
			active.Store(false)
			started <- err
			return
		}
		g.KillBy(killBy)
		if err := g.startCommand(); err != nil {
			g.goneFlag.Store(true) // nothing runs: Close only dismisses the guard
			g.Close()
			active.Store(false)
			started <- err
			return
		}
		g.pid = cmd.Process.Pid
		g.tellGuard(fmt.Sprintf("group %d\n", g.pid))
		if g.cg != nil {
			g.unwatch = make(chan struct{})
			go g.watch(g.unwatch)
		}
		started <- nil
		g.reap()
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return g, nil
}

// startCommand starts the command, in its cgroup if there is one
// (CLONE_INTO_CGROUP, so it is in the cgroup before it runs). If it cannot
// be started into the cgroup (clone3 refused, say, or the command itself
// cannot be run), the cgroup is dropped and the command started once more
// without it, from a copy of cmd: an exec.Cmd cannot be started twice, even
// after a failed Start. The error returned is the second attempt's, which
// names what is wrong with the command itself ("no such file or
// directory") if anything is.
func (g *Group) startCommand() error {
	if g.cg == nil {
		return g.cmd.Start()
	}
	// The guard learns of the cgroup before anything runs in it, so a
	// supervisor that dies at any moment leaves nothing behind.
	g.tellGuard("cgroup " + g.cg.dir + "\n")
	fd, err := g.cg.openDir()
	tried := err == nil
	if tried {
		attr := g.cmd.SysProcAttr
		attr.UseCgroupFD, attr.CgroupFD = true, fd
		err = g.cmd.Start()
		unix.Close(fd)
		attr.UseCgroupFD, attr.CgroupFD = false, 0
		if err == nil {
			return nil
		}
	}
	_ = g.cg.remove(time.Second)
	g.mode = procTreeMode(fmt.Sprintf("cannot start into cgroup %s: %v", g.cg.dir, err))
	g.cg = nil
	if !tried {
		return g.cmd.Start()
	}
	again := &exec.Cmd{
		Path: g.cmd.Path, Args: g.cmd.Args, Env: g.cmd.Env, Dir: g.cmd.Dir,
		Stdin: g.cmd.Stdin, Stdout: g.cmd.Stdout, Stderr: g.cmd.Stderr, ExtraFiles: g.cmd.ExtraFiles,
		SysProcAttr: g.cmd.SysProcAttr, Err: g.cmd.Err, Cancel: g.cmd.Cancel, WaitDelay: g.cmd.WaitDelay,
	}
	if err := again.Start(); err != nil {
		return err
	}
	g.cmd.Process = again.Process // the caller's cmd shows the process, as after its own Start
	return nil
}

// Mode describes how the Group holds the command's tree, with the reason.
// It is either a cgroup v2 of its own or a walk of /proc. In a cgroup,
// every process is killed and frozen with the cgroup, wherever it moves in
// the process tree. The walk of /proc is the fallback where no cgroup can
// be made.
func (g *Group) Mode() string { return g.mode }

// Pid returns the leader's process id, which is also the group's id.
func (g *Group) Pid() int { return g.pid }

// Events returns the channel of the command's events. Gone is the last one;
// the channel is closed after it.
func (g *Group) Events() <-chan Event { return g.events }

// Signal sends sig to the command's process group. It returns an error
// matching syscall.ESRCH when no process of the group is left.
func (g *Group) Signal(sig syscall.Signal) error {
	return unix.Kill(-g.pid, sig)
}

// SignalAll sends sig to every living process of the command, wherever
// it is in the process tree, and to the command's process group. It
// returns how many living processes it found.
//
// In cgroup mode that is every process in the cgroup and the cgroups nested
// in it. SIGKILL goes through cgroup.kill, which no fork escapes. Then
// every descendant found in /proc outside them is moved back in (see
// gather) or, where that is refused, signalled by pid. In process-tree mode
// it is every descendant of the supervisor but the guard, found in /proc.
// That includes a process whose main thread exited while its other threads
// run (shown as a zombie). /proc is scanned again until a scan finds no
// process not signalled yet. So a process forked meanwhile is reached too.
func (g *Group) SignalAll(sig syscall.Signal) int {
	defer unix.Kill(-g.pid, sig)
	if g.cg != nil {
		g.moveMu.Lock()
		defer g.moveMu.Unlock()
		// The cgroup first, at once. Then those that left it: each moved
		// back is signalled as the cgroup was (for SIGKILL, cgroup.kill
		// again, which also reaches what it forked since); each that
		// cannot be moved back is signalled by pid.
		n := g.signalCgroup(sig)
		byPid, moved := g.gather(func(p proc) bool { return unix.Kill(p.pid, sig) == nil }, nil)
		switch {
		case len(moved) > 0 && sig == syscall.SIGKILL:
			g.cg.killAll()
		case len(moved) > 0:
			for _, pid := range moved {
				_ = unix.Kill(pid, sig)
			}
		}
		return n + len(byPid) + len(moved)
	}
	return len(g.eachLiving(g.descendants, func(p proc) bool { return unix.Kill(p.pid, sig) == nil }, nil))
}

// eachLiving calls f once for every living descendant (process-tree
// mode); f reports whether it acted on the process, and settle, if not
// nil, is called with the pids f acted on in a scan before the next scan.
// /proc is scanned again until a scan finds no process f has not seen, the
// same processes, living and dead (zombies), as the scan before, and no
// child of the supervisor exited while it ran: a process that forked and
// exited during a scan shows as a zombie, and its child by a later scan
// (the child is re-parented to the supervisor, which reaps the parent). It
// returns the pids f acted on.
func (g *Group) eachLiving(walk func() []proc, f func(proc) bool, settle func([]int)) []int {
	seen := map[int]bool{}
	var acted []int
	var prev map[int]bool
	for range 100 { // a fork bomb must not hold the supervisor forever
		exits := g.exits.Load()
		cur := map[int]bool{} // pid: living
		var fresh []int
		for _, p := range walk() {
			living := p.living()
			cur[p.pid] = living
			if !living || seen[p.pid] {
				continue
			}
			seen[p.pid] = true
			if f(p) {
				fresh = append(fresh, p.pid)
			}
		}
		acted = append(acted, fresh...)
		if len(fresh) > 0 && settle != nil {
			settle(fresh)
		}
		if len(fresh) == 0 && maps.Equal(cur, prev) && g.exits.Load() == exits {
			break // a child that exited meanwhile may have left one that the scan missed
		}
		if len(fresh) == 0 {
			// A process that forked and exited may not show its child
			// at once: look again a little later.
			time.Sleep(2 * time.Millisecond)
		}
		prev = cur
	}
	return acted
}

// signalCgroup sends sig to every process in the cgroup and the cgroups
// nested in it (SIGKILL through cgroup.kill too), and returns how many it
// found.
func (g *Group) signalCgroup(sig syscall.Signal) int {
	if sig == syscall.SIGKILL {
		return g.cg.killAll()
	}
	n := 0
	for _, pid := range g.cg.members() {
		if unix.Kill(pid, sig) == nil {
			n++
		}
	}
	return n
}

// gather moves back into the cgroup every living descendant of the
// supervisor found outside it and the cgroups nested in it: a process of
// the command that wrote its pid into another cgroup's cgroup.procs (the
// root's, a sibling's, a systemd scope's) is still the supervisor's
// descendant, since the supervisor is a child subreaper. Moved back, it and
// whatever it forks from then on are reached by cgroup.kill and
// cgroup.freeze again, by the guard too. For each one that cannot be moved
// back (no permission, or the command enabled a controller in the
// cgroup's subtree_control, which bars processes from it), f is called
// (nil: none), with settle, as in eachLiving, which rescans until stable;
// each scan lists /proc and reads only what lineage needs, so that gather
// is quick even on a busy machine with many processes. gather returns the
// pids f acted on, and those it moved back.
func (g *Group) gather(f func(proc) bool, settle func([]int)) (acted, moved []int) {
	acted = g.eachLiving(g.lineageProcs, func(p proc) bool {
		outside, in := g.bringBack(p)
		if in {
			moved = append(moved, p.pid)
		}
		return outside && !in && f != nil && f(p)
	}, settle)
	return acted, moved
}

// bringBack moves p into the cgroup if it is a living process outside it
// and the cgroups nested in it. It reports whether p was outside, and
// whether it was moved.
func (g *Group) bringBack(p proc) (outside, moved bool) {
	if in, ok := g.cg.holds(p); in || !ok {
		return false, false
	}
	// The pid is still the process found (not reaped and reused): /proc
	// shows it as a descendant now (so only this Group or a descendant
	// could reap it; see g.descends).
	if !g.descends(p.pid) {
		return false, false
	}
	return true, g.cg.adopt(p.pid) == nil
}

// descends reports whether /proc shows pid as a descendant of the
// supervisor other than the guard or a descendant of the guard, following
// the parents up from pid.
func (g *Group) descends(pid int) bool {
	guard := int(g.guardPid.Load())
	for range 4096 { // deeper than any real tree; a loop (pid reuse) ends here
		if pid == guard {
			return false
		}
		p, ok := readProc(strconv.Itoa(pid))
		if !ok || p.ppid <= 0 {
			return false
		}
		if p.ppid == g.self {
			return true
		}
		pid = p.ppid
	}
	return false
}

// Stop stops the command's group and every other process of the command
// with SIGSTOP, which they cannot catch or ignore. A process that left the
// group must not run on either. Stop takes the terminal back if the group
// had it. In cgroup mode it then freezes the cgroup, so a process forked
// while the signals went out is held too. Continue continues what Stop
// stopped.
func (g *Group) Stop() {
	_ = unix.Kill(-g.pid, syscall.SIGSTOP)
	var stoppedNow []int
	if g.cg != nil {
		// Frozen, nothing forks while the processes are listed; each gets
		// SIGSTOP and acts on it when thawed, before it runs any code of
		// its own, and shows as stopped (job control sees it); then the
		// cgroup is frozen again, so that nothing runs even if someone
		// else continues a process.
		_ = g.cg.freeze(true, 2*time.Second)
		for _, tid := range g.cg.members() {
			if p, ok := readProc(strconv.Itoa(tid)); ok && (p.state == 'T' || p.state == 't') {
				continue // stopped before, by someone else
			}
			if unix.Kill(tid, syscall.SIGSTOP) == nil {
				stoppedNow = append(stoppedNow, tid)
			}
		}
		_ = g.cg.freeze(false, 0)
		waitStopped(stoppedNow, time.Second)
		_ = g.cg.freeze(true, 2*time.Second)
		// Then a descendant that left the cgroup is moved back into it,
		// frozen, which freezes it; one that cannot be moved back is
		// stopped by pid.
		byPid, _ := g.gather(func(p proc) bool {
			if p.state == 'T' || p.state == 't' {
				return false // stopped before, by someone else
			}
			return unix.Kill(p.pid, syscall.SIGSTOP) == nil
		}, func(pids []int) { waitStopped(pids, time.Second) })
		stoppedNow = append(stoppedNow, byPid...)
	} else {
		// Each scan of /proc is made once every process stopped in the
		// scan before has acted on its SIGSTOP, so a child it forked
		// meanwhile exists by then and is found.
		stoppedNow = g.eachLiving(g.descendants, func(p proc) bool {
			if p.state == 'T' || p.state == 't' {
				return false // stopped before, by someone else
			}
			return unix.Kill(p.pid, syscall.SIGSTOP) == nil
		}, func(pids []int) { waitStopped(pids, time.Second) })
	}
	g.stopMu.Lock()
	g.stopped = append(g.stopped, stoppedNow...)
	g.stopMu.Unlock()
	g.TakeTerminal()
}

// waitStopped waits up to d until none of pids runs code of its own: each
// is stopped, gone, or blocked in the kernel (D: a vfork parent waits for
// its stopped child so).
func waitStopped(pids []int, d time.Duration) {
	deadline := time.Now().Add(d)
	for _, pid := range pids {
		for !settled(pid) && time.Now().Before(deadline) {
			time.Sleep(200 * time.Microsecond)
		}
	}
}

// settled reports whether no thread of pid runs (see waitStopped).
func settled(pid int) bool {
	for _, st := range threadStates(pid) {
		switch st {
		case 'T', 't', 'D', 'Z', 'X':
		default:
			return false
		}
	}
	return true
}

// LeaderStopped reports whether the leader is stopped now (by a signal or
// a tracer), read from /proc. Stopped events may be stale: the group may
// have been continued since.
func (g *Group) LeaderStopped() bool {
	p, ok := readProc(strconv.Itoa(g.pid))
	return ok && (p.state == 'T' || p.state == 't')
}

// Continue continues the group, as job control does, and the processes
// outside it that Stop stopped. First it gives the terminal to the
// command's group if the caller's group is in the terminal's foreground. A
// job continued in the background does not take the terminal.
func (g *Group) Continue() {
	if g.tty >= 0 {
		if fg, err := unix.IoctlGetInt(g.tty, unix.TIOCGPGRP); err == nil && fg == unix.Getpgrp() {
			_ = setForeground(g.tty, g.pid)
		}
	}
	if g.cg != nil {
		_ = g.cg.freeze(false, 0)
	}
	_ = unix.Kill(-g.pid, syscall.SIGCONT)
	g.stopMu.Lock()
	stopped := g.stopped
	g.stopped = nil
	g.stopMu.Unlock()
	for _, pid := range stopped {
		_ = unix.Kill(pid, syscall.SIGCONT) // a stopped process exits only if killed
	}
}

// TakeTerminal puts the caller's group back in the terminal's foreground if
// the command's group is there. It does nothing without a terminal.
func (g *Group) TakeTerminal() {
	if g.tty < 0 {
		return
	}
	if fg, err := unix.IoctlGetInt(g.tty, unix.TIOCGPGRP); err == nil && fg == g.pid {
		_ = setForeground(g.tty, unix.Getpgrp())
	}
}

// Close ends the supervision. After Gone, it tells the guard that the
// supervisor ends on purpose, so the guard exits without killing anything.
// It also lets go of the leader's process handle. Called before Gone (a
// panic unwinding through the supervisor, say), it kills the command's
// whole tree and leaves the guard to make sure of it. A second call does
// nothing.
func (g *Group) Close() {
	g.guardMu.Lock()
	defer g.guardMu.Unlock()
	if g.guardW == nil {
		return
	}
	_ = g.guardW.SetWriteDeadline(time.Now().Add(guardWriteWait))
	if g.goneFlag.Load() {
		_, _ = io.WriteString(g.guardW, "done\n")
	} else if g.pid != 0 {
		g.SignalAll(syscall.SIGKILL) // and the guard kills again, without "done"
	}
	_ = g.guardW.Close()
	g.guardW = nil
	if g.cmd.Process != nil {
		_ = g.cmd.Process.Release()
	}
}

// StopSelf stops the calling process with SIGSTOP and returns once it has
// been continued (SIGCONT).
func StopSelf() {
	cont := make(chan os.Signal, 1)
	signal.Notify(cont, syscall.SIGCONT)
	defer signal.Stop(cont)
	if unix.Kill(os.Getpid(), syscall.SIGSTOP) == nil {
		<-cont
	}
}

// reap waits for every child of the process, reports the leader's stops
// and exit, and reports Gone once no child other than the guard is left.
func (g *Group) reap() {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WUNTRACED, nil)
		switch {
		case errors.Is(err, syscall.EINTR):
			continue
		case err != nil: // ECHILD: no child at all, not even the guard
			g.waitEmpty()
			g.gone()
			return
		}
		g.record(pid, ws)
		if ws.Stopped() {
			continue
		}
		for { // reap every other dead child before counting the living
			pid, err := unix.Wait4(-1, &ws, unix.WUNTRACED|unix.WNOHANG, nil)
			if err != nil || pid <= 0 {
				break
			}
			g.record(pid, ws)
		}
		if !g.anyChildLeft() {
			g.waitEmpty()
			g.gone()
			return
		}
	}
}

// waitEmpty waits, in cgroup mode, until the cgroup reports no process
// left (a process the supervisor has no child link to, such as one moved
// out of its subtree, still counts), then removes it.
func (g *Group) waitEmpty() {
	if g.cg == nil {
		return
	}
	for g.cg.populated() {
		time.Sleep(10 * time.Millisecond)
	}
	_ = g.cg.remove(5 * time.Second)
}

func (g *Group) gone() {
	if g.unwatch != nil {
		close(g.unwatch)
	}
	g.goneFlag.Store(true)
	active.Store(false)
	g.events <- Event{Kind: Gone, Reaped: g.reaped}
	close(g.events)
}

func (g *Group) record(pid int, ws unix.WaitStatus) {
	if !ws.Stopped() {
		g.exits.Add(1)
	}
	switch {
	case pid == g.pid && ws.Stopped():
		g.events <- Event{Kind: Stopped, Signal: ws.StopSignal()}
	case pid == g.pid && ws.Signaled():
		g.events <- Event{Kind: Exited, Code: 128 + int(ws.Signal()), Signal: ws.Signal()}
	case pid == g.pid && ws.Exited():
		g.events <- Event{Kind: Exited, Code: ws.ExitStatus()}
	case ws.Stopped():
		// A re-parented descendant stopped: it is ended with the tree.
	case int64(pid) == g.guardPid.Load():
		g.guardPid.Store(0)
	default:
		g.reaped++
	}
}

// anyChildLeft reports whether the process has a child other than the
// guard. As a subreaper it then has no descendant of the command either.
func (g *Group) anyChildLeft() bool {
	guard := int(g.guardPid.Load())
	for _, p := range readProcs() {
		if p.ppid == g.self && p.pid != guard {
			return true
		}
	}
	return false
}

type proc struct {
	pid, ppid int
	state     byte
}

// living reports whether the process runs: it is not a zombie, or it is a
// zombie only because its main thread exited (pthread_exit) while another
// of its threads still runs. Such a process is alive and can be signalled
// through its pid.
func (p proc) living() bool {
	if p.state != 'Z' && p.state != 'X' {
		return true
	}
	return livingThreads(p.pid) > 0
}

// livingThreads counts the threads of pid that are neither zombies nor
// dead, from /proc/PID/task.
func livingThreads(pid int) int {
	n := 0
	for _, st := range threadStates(pid) {
		if st != 'Z' && st != 'X' {
			n++
		}
	}
	return n
}

// threadStates returns the state letter of each thread of pid, from
// /proc/PID/task; none if pid is gone.
func threadStates(pid int) []byte {
	dir := "/proc/" + strconv.Itoa(pid) + "/task"
	names, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []byte
	for _, e := range names {
		b, err := os.ReadFile(dir + "/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
			out = append(out, s[i+2])
		}
	}
	return out
}

// descendants returns every descendant of the process except the guard.
func (g *Group) descendants() []proc {
	procs := readProcs()
	kids := map[int][]proc{}
	for _, p := range procs {
		kids[p.ppid] = append(kids[p.ppid], p)
	}
	guard := int(g.guardPid.Load())
	var out []proc
	queue := []int{g.self}
	for len(queue) > 0 {
		parent := queue[0]
		queue = queue[1:]
		for _, p := range kids[parent] {
			if p.pid == guard {
				continue
			}
			out = append(out, p)
			queue = append(queue, p.pid)
		}
	}
	return out
}

// readProcs lists the processes in /proc with their parent and state.
// Processes that vanish while it reads are skipped.
func readProcs() []proc {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	defer d.Close()
	names, _ := d.Readdirnames(-1)
	out := make([]proc, 0, len(names))
	for _, name := range names {
		if p, ok := readProc(name); ok {
			out = append(out, p)
		}
	}
	return out
}

// readProc reads the parent and state of process name (a pid in decimal).
func readProc(name string) (proc, bool) {
	pid, err := strconv.Atoi(name)
	if err != nil {
		return proc{}, false
	}
	b, err := os.ReadFile("/proc/" + name + "/stat")
	if err != nil {
		return proc{}, false
	}
	// pid (comm) state ppid ...; comm may hold spaces and parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return proc{}, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 {
		return proc{}, false
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		return proc{}, false
	}
	return proc{pid: pid, ppid: ppid, state: f[0][0]}, true
}

// setForeground makes pgid the terminal's foreground group. A background
// caller gets SIGTTOU from tcsetpgrp unless the signal is blocked or
// ignored, so it is blocked on this (locked) thread around the call; the
// process keeps its SIGTTOU handling everywhere else.
func setForeground(fd, pgid int) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var set, old unix.Sigset_t
	const bits = 8 * int(unsafe.Sizeof(set.Val[0]))
	n := int(syscall.SIGTTOU) - 1
	set.Val[n/bits] |= 1 << (n % bits)
	if err := unix.PthreadSigmask(unix.SIG_BLOCK, &set, &old); err != nil {
		return err
	}
	defer unix.PthreadSigmask(unix.SIG_SETMASK, &old, nil)
	return unix.IoctlSetPointerInt(fd, unix.TIOCSPGRP, pgid)
}
