package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/cli/proof"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// attackKinds are the processes attacker.c starts (see its comment),
// the cgroup movers included: one attacker set for run, elect and
// partitions run.
var attackKinds = []string{"setsid", "double", "thread", "cont", "stopper", "cgnest", "cgaway", "leader"}

// leftGroup are the kinds that leave fenced's process group (setsid), which
// the process-tree mode cannot reach once fenced is killed with kill -9.
var leftGroup = map[string]bool{"setsid": true, "thread": true, "stopper": true, "cont": true, "cgnest": true, "cgaway": true}

// awaySeq numbers the cgroups the attackers of one test process move to.
var awaySeq atomic.Int64

// attackArgv returns the attacker's command line writing its attempts to
// out and its pids to pids, with the cgroup movers: "cgnest" makes a
// cgroup inside its own (fenced's, in cgroup mode; the test's, in
// process-tree mode, where no cgroup of fenced's exists) and moves there;
// "cgaway" moves into a cgroup the test makes beside fenced's, as the
// root, a systemd scope or a container's cgroup would be. Both need a
// writable cgroup2 hierarchy (here: root, or a delegated subtree); where
// the move is refused the attacker says why and the test fails with it.
// The cgroups are removed when the test ends.
func attackArgv(t *testing.T, bin, out, pids string) []string {
	t.Helper()
	mount, own := cgroup2Paths(t)
	away := filepath.Join(own, fmt.Sprintf("fenced-test-away-%d-%d", os.Getpid(), awaySeq.Add(1)))
	if err := os.Mkdir(away, 0o755); err != nil {
		t.Fatalf("cannot make a cgroup for the attacker to move to (the cgroup2 hierarchy at %s must be writable, "+
			"as where tests run as root or in a delegated subtree): %v", mount, err)
	}
	t.Cleanup(func() {
		killAttackers(bin, pids)
		dirs := []string{away}
		// The nested cgroups of process-tree mode, in the test's own (in
		// cgroup mode fenced removes them with its own): one for each
		// attacker started.
		b, _ := os.ReadFile(pids)
		for _, l := range strings.Split(string(b), "\n") {
			if pid, ok := strings.CutPrefix(l, "cgnest "); ok {
				dirs = append(dirs, filepath.Join(own, "attacker-nest-"+pid))
			}
		}
		for _, dir := range dirs {
			// An escapee still in it (the test failed before it killed
			// the attackers, or one moved after that) ends with it.
			_ = os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0)
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
				if err := os.Remove(dir); err == nil || errors.Is(err, os.ErrNotExist) {
					break
				}
			}
		}
	})
	return []string{bin, out, pids, "10", mount, away}
}

// killAttackers kills, at a test's end, every process of bin that pids
// lists and that is still alive, and waits until they are gone. A member
// may have taken the partition again once the test's own grant was gone,
// and started a new tree after the test's checks; killed at the end, it
// leaves that tree to its supervisor, which ends it a moment later. Until
// then its processes write into the test's directory as it is removed
// (hog run 2 of 2026-12-07: "unlinkat …: directory not empty"). A pid is
// killed only while it still runs bin, so a reused one is left alone.
func killAttackers(bin, pids string) {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		left := false
		b, _ := os.ReadFile(pids) // again each time: a tree starting now adds to it
		for _, l := range strings.Split(string(b), "\n") {
			f := strings.Fields(l)
			if len(f) != 2 || f[0] == "error" {
				continue
			}
			pid, err := strconv.Atoi(f[1])
			if err != nil {
				continue
			}
			if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err == nil && exe == bin && alive(pid) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				left = true
			}
		}
		if !left {
			return
		}
	}
}

// attempt is one line attacker.c wrote: a write attempted with fence at
// t (CLOCK_MONOTONIC), at offset in its file.
type attempt struct {
	fence  string
	t      int64
	kind   string
	pid    int
	offset int64
}

func readAttempts(t *testing.T, file string) []attempt {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var as []attempt
	var off int64
	for _, l := range strings.SplitAfter(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) == 4 && strings.HasSuffix(l, "\n") {
			ts, err1 := strconv.ParseInt(f[1], 10, 64)
			pid, err2 := strconv.Atoi(f[3])
			if err1 != nil || err2 != nil {
				t.Fatalf("bad attempt line %q", l)
			}
			as = append(as, attempt{strings.TrimPrefix(f[0], "fence="), ts, f[2], pid, off})
		}
		off += int64(len(l))
	}
	return as
}

// attackerPids reads attacker.c's PIDS file: kind -> pid.
func attackerPids(file string) map[string]int {
	b, _ := os.ReadFile(file)
	m := map[string]int{}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] != "error" {
			if pid, err := strconv.Atoi(f[1]); err == nil {
				m[f[0]] = pid
			}
		}
	}
	return m
}

// Supervision under attack: a command tree that tries every escape
// (attacker.c: setsid, double fork, a thread writing after its main thread
// exited, SIGTERM and terminal stops ignored, a process that stops itself
// and is continued by another, a process that moves into a cgroup it made
// inside its own, one that moves into another cgroup) runs under `fenced
// run` and under `fenced elect` against Redis through a proxy, and fenced
// is attacked: its link is black-holed (the lease is lost unrenewed), it
// is stopped with Ctrl-Z (SIGTSTP) past the TTL and continued after a new
// holder took the key, it is stopped with SIGSTOP alike, or it is killed
// with kill -9. A new holder polls for the key directly; checked, by the
// attempts each process logs before writing: no write with the old fence
// is attempted after the new holder's grant began (by the clock, and by
// the file offset: a write timed before the grant but made after it
// counts), not only refused. The rows of docs/supervision.md that promise
// less are checked for what they promise: in process-tree mode kill -9 or
// SIGSTOP of fenced leaves the processes that left the group alive, and
// only those may write on; once continued, a stopped fenced ends the tree
// at once and exits 77; in cgroup mode a
// process that moved to another cgroup is covered by kill -9 once fenced
// moved it back, which the test waits for (and times) before the kill.
func TestRunUnderAttack(t *testing.T) {
	if testing.Short() {
		t.Skip("long: run and elect under loss, ctrl-z, SIGSTOP and kill -9 in both modes; run without -short")
	}
	bin := attackerBin(t)
	for _, command := range []string{"run", "elect"} {
		t.Run(command, func(t *testing.T) {
			for _, attack := range []string{"loss", "ctrl-z", "sigstop", "kill-9"} {
				t.Run(attack, func(t *testing.T) {
					inMode(t, func(t *testing.T, mode string) {
						runAttack(t, bin, attackScenario{command: command, attack: attack, mode: mode, ttl: 2 * time.Second, grace: 300 * time.Millisecond})
					})
				})
			}
		})
	}
}

// attackScenario is one supervisor under one attack: command is "run",
// "elect" or "partitions"; mode the supervision mode's name as -v says it;
// the attack comes delay after every escapee has started.
type attackScenario struct {
	command, attack, mode string
	ttl, grace, delay     time.Duration
}

// attackResult is what a scenario saw: attempts with the old fence, those
// attempted after the newer grant (late) and, of them, those the
// scenario's row of docs/supervision.md allows (excused: fence only).
type attackResult struct {
	attempts, late, excused int
	violation               string // the first broken promise, if any
}

// violate reports a broken promise on t and keeps the first for the
// generative row's report.
func (r *attackResult) violate(t *testing.T, format string, a ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, a...)
	if r.violation == "" {
		r.violation = msg
	}
	t.Error(msg)
}

func runAttack(t *testing.T, bin string, sc attackScenario) (res attackResult) {
	command, attack, mode, ttl := sc.command, sc.attack, sc.mode, sc.ttl
	r := testenv.StartRedis(t, testenv.RedisConfig{})
	px := testenv.StartProxy(t, r.Addr())
	viaProxy := strings.Replace(r.URL(), r.Addr(), px.Addr, 1)
	dir := t.TempDir()
	out, pids := filepath.Join(dir, "attempts"), filepath.Join(dir, "pids")
	const key = "job:attack"
	args := append([]string{"-v", command, "--min-fence", "repeatable", "--ttl", ttl.String(), "--grace", sc.grace.String(), key, "--"},
		attackArgv(t, bin, out, pids)...)
	sched := testenv.SampleLateness() // this process's scheduling, for the sigstop bound
	defer sched.Stop()
	cmd, _, errb := startRunOf(t, productBin(t), viaProxy, args...)
	checkMode(t, errb, mode)
	old := startedAttacker(t, out, pids)
	oldPids := attackerPids(pids)
	time.Sleep(sc.delay)

	var killed int64 // when a kill -9 was sent
	switch attack {
	case "loss":
		px.BlackHole(true)
		t.Cleanup(func() { px.BlackHole(false) })
	case "ctrl-z":
		if err := cmd.Process.Signal(syscall.SIGTSTP); err != nil {
			t.Fatal(err)
		}
		eventually(t, 10*time.Second, "fenced did not stop", func() bool { return stopped(cmd.Process.Pid) })
	case "sigstop":
		if strings.HasPrefix(mode, "cgroup") {
			// As for kill -9: a stopped fenced moves no escapee back.
			awaitMovedBack(t, cmd.Process.Pid, oldPids["cgaway"])
		}
		if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
	case "kill-9":
		if strings.HasPrefix(mode, "cgroup") {
			awaitMovedBack(t, cmd.Process.Pid, oldPids["cgaway"])
		}
		killed = proof.Now()
		if err := cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
	}

	grantT, grantOff, newFence := awaitNewHolder(t, client(t, r.URL()), key, out, old,
		&fenced.LeaseOptions{TTL: 30 * time.Second, MinFence: fenced.FenceRepeatable}, command+" "+attack, ttl, errb)
	if killed != 0 {
		t.Logf("kill -9 sent %dms before the new grant's try", (grantT-killed)/1e6)
		defer func() { logGuard(t, errb.String(), killed) }()
	}
	continued, continuedAt := time.Now(), proof.Now()
	if attack == "ctrl-z" || attack == "sigstop" {
		if err := cmd.Process.Signal(syscall.SIGCONT); err != nil { // fg
			t.Fatal(err)
		}
	}
	code, exited := exitWithin(cmd, 15*time.Second)
	// SIGSTOP of fenced alone: once continued, its validity long ended, it
	// must kill the tree at once, not after --grace (which the tree,
	// ignoring SIGTERM, would use to write on). The bound is half the
	// grace and twice the scheduling delay this process saw: it excludes
	// waiting for the grace and nothing finer. Where the delay leaves no
	// room for that (a --grace under 1 s, or a delay over a quarter of
	// it), the two cannot be told apart here, and it is only logged. It
	// counts until fenced chose its exit code: the kernel's teardown of a
	// race-built process after that took up to 1.5 s under load.
	took := time.Since(continued)
	if at, ok := exitDecided(errb); ok {
		took = time.Duration(at - continuedAt)
	}
	if attack == "sigstop" && exited {
		bound := sc.grace/2 + 2*sched.Max()
		t.Logf("fenced chose its exit %v after it was continued (--grace %v; bound %v: half of it and twice the scheduling delay seen, %v)",
			took.Round(time.Millisecond), sc.grace, bound.Round(time.Millisecond), sched.Max().Round(time.Millisecond))
		if sc.grace >= time.Second && bound < sc.grace && took > bound {
			res.violate(t, "%s %s, sigstop: fenced took %v to end the tree once continued, its validity ended; want SIGKILL at once "+
				"(--grace %v not waited for; bound %v)", command, mode, took.Round(time.Millisecond), sc.grace, bound.Round(time.Millisecond))
		}
	}
	time.Sleep(time.Second) // an escapee would write on meanwhile
	switch want := 77; {
	case attack == "kill-9" || !exited:
	case code != want:
		res.violate(t, "fenced %s exited %d after %s, want %d; stderr %s", command, code, attack, want, errb)
	}

	if attack == "sigstop" {
		logGuard(t, errb.String(), grantT)
	}
	late, n, alive := attackOutcome(t, out, oldPids, old, newFence, grantT, grantOff)
	res.attempts = n
	for _, k := range late {
		res.late += k
	}
	t.Logf("%s %s, %s: %d attempts with fence %s; new holder's fence %d; attempts after its grant by kind %v; alive after: %v",
		command, mode, attack, n, old, newFence, late, alive)
	// fenced killed or stopped: its guard kills the tree, the cgroup or
	// the command's group, by the moment fenced would have.
	if (attack == "kill-9" || attack == "sigstop") && strings.HasPrefix(mode, "process tree") {
		for kind := range late {
			if !leftGroup[kind] {
				res.violate(t, "process-tree mode, %s: %q (it stayed in the group) attempted %d writes after the new grant", attack, kind, late[kind])
			}
		}
		for kind, k := range late {
			if leftGroup[kind] {
				res.excused += k
			}
		}
		if len(late) > 0 {
			t.Logf("documented limit (run --help): in process-tree mode, processes that left the group survive kill -9 or SIGSTOP of fenced; %v wrote after the new grant", late)
		}
		return res
	}
	switch {
	case len(late) > 0 && attack == "loss" && strings.HasPrefix(mode, "process tree") && strings.Contains(errb.String(), tooBusy):
		res.excused = res.late
		t.Logf("documented limit (docs/supervision.md): in process-tree mode a machine too busy for fenced to walk /proc before the validity ends lets the tree write on, and fenced says so; %v wrote after the new grant", late)
	case len(late) > 0:
		res.violate(t, "%s %s, %s: writes with the old fence %s attempted after the new holder's grant (fence %d): %v", command, mode, attack, old, newFence, late)
	}
	if !exited {
		// Killed by the test; the attempts above say what it waited for.
		res.violate(t, "%s %s, %s: fenced still running 15s after the new grant", command, mode, attack)
	}
	if len(alive) > 0 {
		res.violate(t, "%s %s, %s: escapees alive after fenced ended: %v", command, mode, attack, alive)
	}
	return res
}

// exitDecided reads when the fenced whose stderr is errb chose its exit
// code (CLOCK_MONOTONIC ns), as startRun had it record.
func exitDecided(errb outFile) (int64, bool) {
	b, err := os.ReadFile(filepath.Join(filepath.Dir(string(errb)), "exit"))
	var code int
	var at int64
	if err != nil {
		return 0, false
	}
	if _, err := fmt.Sscanf(string(b), "%d %d", &code, &at); err != nil {
		return 0, false
	}
	return at, true
}

// exitWithin waits up to d for cmd and returns its exit code; if it is
// still running then, it kills it and returns false.
func exitWithin(cmd *exec.Cmd, d time.Duration) (code int, exited bool) {
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
		return cmd.ProcessState.ExitCode(), true
	case <-time.After(d):
		_ = cmd.Process.Kill()
		<-done
		return -1, false
	}
}

// attackerBin compiles internal/cli/supervise/testdata/attacker.c.
func attackerBin(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "attacker")
	if out, err := exec.Command("gcc", "-O1", "-pthread", "-o", bin, "../../internal/cli/supervise/testdata/attacker.c").CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	return bin
}

// startedAttacker waits until every escapee of the attacker
// writing to out (its pids in pids) has started and the attacker writes, and returns
// the fence it writes with.
func startedAttacker(t *testing.T, out, pids string) string {
	t.Helper()
	t.Cleanup(func() {
		// Every attacker's: a member may have started the command again.
		b, _ := os.ReadFile(pids)
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) == 2 {
				if pid, err := strconv.Atoi(f[1]); err == nil {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
	})
	eventually(t, 20*time.Second, "not every escapee started", func() bool {
		b, _ := os.ReadFile(pids)
		for _, l := range strings.Split(string(b), "\n") {
			if why, ok := strings.CutPrefix(l, "error "); ok {
				t.Fatalf("an attacker could not escape, so the test would prove nothing: %s", why)
			}
		}
		return len(attackerPids(pids)) == len(attackKinds)
	})
	if !grows(out, 5*time.Second) {
		t.Fatal("the attacker does not write")
	}
	old := readAttempts(t, out)[0].fence
	if old == "" {
		t.Fatal("FENCED_FENCE is empty")
	}
	return old
}

// awaitNewHolder polls key with adm until it is granted, as a new holder
// would, and returns when the grant happened: after the start of the call
// that got it (grantT, CLOCK_MONOTONIC) and after the attempts file out
// had size grantOff; and the new fence, which must not be old. It fails
// after 20s; what and ttl name the attack for the message.
func awaitNewHolder(t *testing.T, adm *fenced.Client, key, out, old string, opts *fenced.LeaseOptions, what string, ttl time.Duration, errb outFile) (grantT, grantOff int64, fence uint64) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no new holder of %s within 20s of the %s (--ttl %v); stderr %s", key, what, ttl, errb)
		}
		grantT, grantOff = proof.Now(), fileSize(out)
		l, err := adm.TryAcquire(context.Background(), key, opts)
		if err == nil {
			fence = l.Fence()
			// A write after grantT counts as after the grant; a slow try
			// (a starved test) stretches that window, which this says.
			t.Logf("the new holder's try took %v", time.Duration(proof.Now()-grantT).Round(time.Millisecond))
			break
		}
	}
	if strconv.FormatUint(fence, 10) == old {
		t.Fatalf("the new holder of %s got the old fence %s", key, old)
	}
	return grantT, grantOff, fence
}

// attackOutcome reads the attempts in out: n made with the fence old, and,
// by kind, those made after the new grant (by the clock, or by the file
// offset: a write timed before the grant but made after it counts); and
// which escapees (oldPids: kind -> pid, as read before the attack) are
// still alive. An attempt with another fence than old or newFence (the
// member's own new grant, whose command writes to the same file) fails
// the test.
func attackOutcome(t *testing.T, out string, oldPids map[string]int, old string, newFence uint64, grantT, grantOff int64) (
	late map[string]int, n int, alive []string) {
	t.Helper()
	late = map[string]int{}
	for _, a := range readAttempts(t, out) {
		if a.fence == strconv.FormatUint(newFence, 10) {
			continue
		}
		if a.fence != old {
			t.Errorf("an attempt with fence %q, not the holder's %s: %+v", a.fence, old, a)
			continue
		}
		n++
		if a.t >= grantT || a.offset >= grantOff {
			late[a.kind]++
			if !leftGroup[a.kind] {
				// Timed before the grant's try: a write in flight that
				// landed after it (counted all the same).
				t.Logf("late attempt by %s (pid %d): timed %+dms from the new grant's try, at offset %d (grant's %d)",
					a.kind, a.pid, (a.t-grantT)/1e6, a.offset, grantOff)
			}
		}
	}
	for kind, pid := range oldPids {
		if threadsAlive(pid) {
			alive = append(alive, kind)
		}
	}
	return late, n, alive
}

// logGuard logs, from fenced's stderr, when the supervisor's guard saw its
// pipe close (or its deadline pass), killed the tree and saw it gone, each
// from since, a CLOCK_MONOTONIC reading (supervise.TraceEnv): a tree that
// wrote on after the new grant was late to die because of one of those
// steps.
func logGuard(t *testing.T, stderr string, since int64) {
	t.Helper()
	for _, line := range strings.Split(stderr, "\n") {
		var acted, kill, gone, deadline, woke, faults int64
		if _, err := fmt.Sscanf(line, "supervise guard: acted at %d, first kill done at %d, tree gone at %d (CLOCK_MONOTONIC ns); deadline %d, woke at %d (CLOCK_BOOTTIME ns); %d major",
			&acted, &kill, &gone, &deadline, &woke, &faults); err == nil {
			t.Logf("the guard acted %v after it (its pipe closed or its deadline passed), its first kill was done %v after it, the tree gone %v after it; %s; %d major page faults as it waited, woke and killed",
				time.Duration(acted-since), time.Duration(kill-since), time.Duration(gone-since), guardDeadline(deadline, woke), faults)
			return
		}
	}
	t.Logf("the guard said nothing of a kill on fenced's stderr")
}

// guardDeadline says how the guard's waking related to its last deadline.
func guardDeadline(deadline, woke int64) string {
	if deadline == 0 {
		return "it had no deadline"
	}
	return fmt.Sprintf("it woke %v after its deadline (before it: its pipe closed)", time.Duration(woke-deadline))
}
