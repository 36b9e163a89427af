//go:build linux

package supervise

import (
	"os"
	"runtime"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// watchPause is the shortest pause between two rounds of watch.
const watchPause = 250 * time.Millisecond

// watch moves back into the cgroup, round after round until done is
// closed, every descendant that left it (see gather), so that kill -9 of
// the supervisor, which leaves only the guard and the cgroup, misses none
// that left it more than one pause earlier.
//
// A round costs little however many processes the system runs: it lists
// /proc, reads the stat file only of the processes it has not seen in an
// earlier round (see lineage), and reads /proc only for the supervisor's
// own descendants. The pause is watchPause, or 100 times the CPU time the
// round took if longer (at most about 1% of a CPU). CPU time, not elapsed
// time: on a busy machine a round waits for a CPU far longer than it uses
// one, and the pause must not grow with that wait.
func (g *Group) watch(done <-chan struct{}) {
	runtime.LockOSThread() // the thread's CPU clock measures the rounds
	defer runtime.UnlockOSThread()
	for {
		start := threadCPU()
		for range 10 { // bounded: a fork bomb outside is ended by SignalAll
			moved := 0
			for _, p := range g.lineageProcs() {
				if !p.living() {
					continue
				}
				g.moveMu.Lock() // one move at a time: SignalAll waits for no more
				_, ok := g.bringBack(p)
				g.moveMu.Unlock()
				if ok {
					moved++
				}
			}
			if moved == 0 {
				break
			}
		}
		select {
		case <-done:
			return
		case <-time.After(max(watchPause, 100*(threadCPU()-start))):
		}
	}
}

// lineageProcs returns the supervisor's descendants but the guard's
// tree, found with g.lin.
func (g *Group) lineageProcs() []proc {
	g.linMu.Lock()
	pids := g.lin.update(g.self, int(g.guardPid.Load()))
	g.linMu.Unlock()
	out := make([]proc, 0, len(pids))
	for _, pid := range pids {
		if p, ok := readProc(strconv.Itoa(pid)); ok {
			out = append(out, p)
		}
	}
	return out
}

// threadCPU returns the CPU time the calling thread has used.
func threadCPU() time.Duration {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts)
	return time.Duration(ts.Nano())
}

// lineage knows, for every process in /proc, whether it descends from the
// supervisor. That never changes while the supervisor lives: an orphan is
// re-parented to its nearest subreaper ancestor, the supervisor or one of
// its descendants, and a process outside the supervisor's tree has no
// such ancestor. So a process's stat file is read once, when it first
// shows in /proc. A pid that ends and is reused between two updates keeps
// what its first process was: a process found outside the cgroup has its
// parentage read afresh (Group.descends) before it is moved or signalled,
// so a stranger is never touched; a new descendant behind a reused pid is
// missed until that pid ends, which takes a pid space wrapping around
// between two updates (at most 250 ms apart while the Group runs).
type lineage struct {
	known map[int]bool // pid: descends from the supervisor (the guard's tree does not)
}

// update lists /proc and returns the supervisor's descendants, but for
// guard and its descendants.
func (l *lineage) update(self, guard int) []int {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	now := make(map[int]bool, len(names))
	for _, name := range names {
		if pid, err := strconv.Atoi(name); err == nil {
			now[pid] = true
		}
	}
	if l.known == nil {
		l.known = map[int]bool{}
	}
	for pid := range l.known {
		if !now[pid] {
			delete(l.known, pid)
		}
	}
	var out []int
	for pid := range now {
		if v, _ := l.descends(pid, self, guard, 0); v {
			out = append(out, pid)
		}
	}
	return out
}

// descends reports whether pid descends from self (not through guard),
// reading the stat files of pid and of its ancestors not known yet. sure
// is false if a process on the way was gone before its stat file was read:
// then pid (re-parented meanwhile) is not recorded, and is read again in
// the next round.
func (l *lineage) descends(pid, self, guard, depth int) (v, sure bool) {
	if v, ok := l.known[pid]; ok {
		return v, true
	}
	if pid == guard || pid == self || depth > 4096 {
		return false, true
	}
	p, ok := readProc(strconv.Itoa(pid))
	if !ok {
		return false, false
	}
	v, sure = p.ppid == self, true
	if !v && p.ppid > 1 {
		v, sure = l.descends(p.ppid, self, guard, depth+1)
	}
	if sure {
		l.known[pid] = v
	}
	return v, sure
}
