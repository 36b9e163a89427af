package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fence"
)

// Tests of `fenced run` supervising real process trees: the whole group on
// loss and on exit, stop and continue, the death of fenced, the terminal,
// and the exit code after a loss. The processes are sh scripts that write
// their pids to files, so the tests can look at them in /proc.

// procState returns the state letter of pid from /proc (R, S, T, Z, ...),
// or 0 if there is no such process.
func procState(pid int) byte {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return 0
	}
	return s[i+2]
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	st := procState(pid)
	return st != 0 && st != 'Z'
}

// stopped reports whether pid is stopped by a signal, or frozen in vfork
// behind a stopped child: shells such as dash start commands with vfork,
// and a vfork parent waits (state D) until the child has exec'd, so it
// cannot stop, nor run, while that child is stopped.
func stopped(pid int) bool {
	switch procState(pid) {
	case 'T':
		return true
	case 'D':
		for _, p := range procs() {
			if p.state == 'T' && p.ppid == pid {
				return true
			}
		}
	}
	return false
}

// proc is one process as its /proc/PID/stat shows it.
type proc struct {
	pid, ppid int
	state     byte
}

// procs lists the processes in /proc; those gone while read are left out.
func procs() []proc {
	names, _ := filepath.Glob("/proc/[0-9]*/stat")
	out := make([]proc, 0, len(names))
	for _, name := range names {
		b, err := os.ReadFile(name)
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 2 || f[0] == "" {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(name)))
		ppid, _ := strconv.Atoi(f[1])
		out = append(out, proc{pid: pid, ppid: ppid, state: f[0][0]})
	}
	return out
}

// eventually fails the test unless cond becomes true within d.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", d, what)
		}
	}
}

// readPid waits until file holds a pid and returns it.
func readPid(t *testing.T, file string) int {
	t.Helper()
	var pid int
	eventually(t, 20*time.Second, "no pid in "+file, func() bool {
		b, err := os.ReadFile(file)
		if err != nil || !bytes.HasSuffix(b, []byte("\n")) {
			return false
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil
	})
	return pid
}

// startRun starts `fenced run ...` and returns it with its stdout and
// stderr. They are files, not pipes: cmd.Wait then returns when fenced
// exits, not when the last process holding a pipe does. The process is
// killed at the end of the test if still running.
func startRun(t *testing.T, store string, args ...string) (*exec.Cmd, outFile, outFile) {
	t.Helper()
	return startRunOf(t, os.Args[0], store, args...)
}

// startRunOf is startRun with fenced binary bin (cliCmdOf).
func startRunOf(t *testing.T, bin, store string, args ...string) (*exec.Cmd, outFile, outFile) {
	t.Helper()
	cmd, _, _ := cliCmdOf(t, bin, store, args...)
	dir := t.TempDir()
	cmd.Env = append(cmd.Env, exitTraceEnv+"="+filepath.Join(dir, "exit")) // read by exitDecided
	out, errb := outFile(filepath.Join(dir, "stdout")), outFile(filepath.Join(dir, "stderr"))
	stdout, err := os.Create(string(out))
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := os.Create(string(errb))
	if err != nil {
		t.Fatal(err)
	}
	defer stdout.Close()
	defer stderr.Close()
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		if t.Failed() {
			t.Logf("fenced's stderr:\n%s", errb)
		}
	})
	return cmd, out, errb
}

// waitExit waits for cmd and returns its exit code, failing after d.
func waitExit(t *testing.T, cmd *exec.Cmd, d time.Duration) int {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0
	case <-time.After(d):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("fenced still running after %v", d)
		return -1
	}
}

// outFile is a file a process writes its output to.
type outFile string

func (f outFile) String() string {
	b, _ := os.ReadFile(string(f))
	return string(b)
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Issue 9 item 1, the reproduction: on loss a grandchild that
// ignores SIGTERM (and whose parent exits on it) must be killed after
// --grace, and fenced exits only once it is gone; it never writes after a
// new holder got the key.
func TestRunLostLeaseEndsWholeGroup(t *testing.T) {
	if testing.Short() {
		t.Skip("long: a lease loss waits out a TTL; run without -short")
	}
	store := tempStore(t)
	dir := t.TempDir()
	pidFile, marker := filepath.Join(dir, "pid"), filepath.Join(dir, "marker")
	script := fmt.Sprintf(`trap 'exit 0' TERM; sh -c 'trap "" TERM; echo $$ > %s; sleep 2; echo LATE >> %s' & wait`, pidFile, marker)
	cmd, _, errb := startRun(t, store, "run", "--ttl", "2s", "--grace", "500ms", "job:x", "--", "sh", "-c", script)
	grandchild := readPid(t, pidFile)
	operator := client(t, store)
	if _, err := operator.Break(context.Background(), "job:x", "test", "test"); err != nil {
		t.Fatal(err)
	}
	if code := waitExit(t, cmd, 20*time.Second); code != 77 {
		t.Fatalf("exit %d, want 77; stderr %s", code, errb)
	}
	if alive(grandchild) {
		t.Fatalf("fenced exited while the grandchild %d (ignoring SIGTERM) was still running; stderr %s", grandchild, errb)
	}
	l, err := operator.TryAcquire(context.Background(), "job:x", &fenced.LeaseOptions{TTL: 5 * time.Second})
	if err != nil || l.Fence() != 2 {
		t.Fatalf("new holder: %v, fence %d; want fence 2", err, l.Fence())
	}
	time.Sleep(2500 * time.Millisecond) // past the grandchild's sleep
	if b, err := os.ReadFile(marker); err == nil {
		t.Fatalf("the old group wrote %q after a new holder got fence 2", b)
	}
	if !strings.Contains(errb.String(), "SIGKILL") || !strings.Contains(errb.String(), "(exit 77)") {
		t.Fatalf("stderr does not tell of the SIGKILL and fenced's own 77: %s", errb)
	}
}

// Issue 9 item 1: when COMMAND exits normally, what it left behind (here a
// process in its group and one that left it with setsid, both ignoring
// SIGTERM) is killed before the lease is released, and fenced passes on
// COMMAND's code.
func TestRunKillsLeftoversBeforeRelease(t *testing.T) {
	store := tempStore(t)
	dir := t.TempDir()
	inGroup, escaped := filepath.Join(dir, "in-group"), filepath.Join(dir, "escaped")
	marker := filepath.Join(dir, "marker")
	leftover := `trap "" TERM; echo $$ > %s; sleep 3; echo LATE >> ` + marker
	script := fmt.Sprintf(`sh -c '`+leftover+`' &
setsid sh -c '`+leftover+`' &
while [ ! -s %s ] || [ ! -s %s ]; do sleep 0.01; done
exit 3`, inGroup, escaped, inGroup, escaped)
	cmd, _, errb := startRun(t, store, "run", "--grace", "300ms", "job:left", "--", "sh", "-c", script)
	pids := []int{readPid(t, inGroup), readPid(t, escaped)}
	if code := waitExit(t, cmd, 20*time.Second); code != 3 {
		t.Fatalf("exit %d, want COMMAND's 3; stderr %s", code, errb)
	}
	for _, pid := range pids {
		if alive(pid) {
			t.Fatalf("process %d left by COMMAND still runs after fenced released the lease and exited; stderr %s", pid, errb)
		}
	}
	if l, _ := client(t, store).List(context.Background(), ""); len(l) != 0 {
		t.Fatalf("lease still held: %+v", l)
	}
	if !strings.Contains(errb.String(), "exited and left 4 processes") { // two sh and their sleeps
		t.Fatalf("stderr does not say what was left: %s", errb)
	}
	if strings.Contains(errb.String(), "(exit") {
		t.Fatalf("COMMAND's own code came with fenced's exit line: %s", errb)
	}
}

// Issue 9 item 2: SIGTSTP to fenced stops COMMAND's whole group first, then
// fenced; SIGCONT continues the group while the lease is valid; after the
// lease lapsed during a stop, SIGCONT kills the stopped group without
// letting it run, and fenced exits 77.
func TestRunSIGTSTPStopsGroupFirst(t *testing.T) {
	store := tempStore(t)
	dir := t.TempDir()
	leaderFile, childFile, ticks := filepath.Join(dir, "leader"), filepath.Join(dir, "child"), filepath.Join(dir, "ticks")
	script := fmt.Sprintf(`echo $$ > %s; sleep 30 & echo $! > %s; while :; do echo tick >> %s; sleep 0.05; done`, leaderFile, childFile, ticks)
	cmd, _, errb := startRun(t, store, "run", "--ttl", "1s", "job:stop", "--", "sh", "-c", script)
	leader, child := readPid(t, leaderFile), readPid(t, childFile)
	fencedPid := cmd.Process.Pid
	size := func() int64 {
		fi, err := os.Stat(ticks)
		if err != nil {
			return 0
		}
		return fi.Size()
	}

	if err := cmd.Process.Signal(syscall.SIGTSTP); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "COMMAND's group is not stopped after SIGTSTP to fenced", func() bool {
		return stopped(leader) && stopped(child)
	})
	eventually(t, 10*time.Second, "fenced did not stop itself", func() bool { return stopped(fencedPid) })

	// Continued while the lease is valid: the group runs again.
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the group was not continued with fenced", func() bool {
		return !stopped(leader) && !stopped(child)
	})
	before := size()
	eventually(t, 10*time.Second, "COMMAND does not run after the continue", func() bool { return size() > before })

	// Stopped past the TTL: another holder gets the key; then the old group
	// must never run again.
	if err := cmd.Process.Signal(syscall.SIGTSTP); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "not stopped after the second SIGTSTP", func() bool {
		return stopped(leader) && stopped(child) && stopped(fencedPid)
	})
	frozen := size()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l, err := client(t, store).Acquire(ctx, "job:stop", &fenced.LeaseOptions{TTL: 5 * time.Second, MaxWait: 15 * time.Second})
	if err != nil {
		t.Fatalf("another holder never got the key from a stopped fenced: %v", err)
	}
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if code := waitExit(t, cmd, 20*time.Second); code != 77 {
		t.Fatalf("exit %d after continuing with the lease lost (fence %d is held now), want 77; stderr %s", code, l.Fence(), errb)
	}
	if alive(leader) || alive(child) {
		t.Fatal("the old group still runs")
	}
	if got := size(); got != frozen {
		t.Fatalf("the old group ran after its lease was lost: ticks grew from %d to %d bytes", frozen, got)
	}
}

// Issue 9 items 2 and 3: a COMMAND that is stopped (here by its own
// SIGSTOP) must not keep the lease: fenced stops too, renews nothing, and
// when continued after the lease lapsed it kills the group and exits 77.
func TestRunStoppedChildDoesNotKeepLease(t *testing.T) {
	store := tempStore(t)
	marker := filepath.Join(t.TempDir(), "resumed")
	cmd, _, errb := startRun(t, store, "run", "--ttl", "1s", "job:stopped", "--", "sh", "-c", "kill -STOP $$; touch "+marker)
	waitHeld(t, client(t, store), "job:stopped")
	eventually(t, 10*time.Second, "fenced did not stop with its stopped COMMAND", func() bool { return stopped(cmd.Process.Pid) })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := client(t, store).Acquire(ctx, "job:stopped", &fenced.LeaseOptions{TTL: 5 * time.Second, MaxWait: 10 * time.Second}); err != nil {
		t.Fatalf("the lease of a stopped COMMAND never lapsed: %v; stderr %s", err, errb)
	}
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if code := waitExit(t, cmd, 20*time.Second); code != 77 {
		t.Fatalf("exit %d, want 77; stderr %s", code, errb)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("COMMAND ran on after its lease was lost")
	}
}

// Issue 9 item 2: when fenced dies (kill -9), COMMAND and the rest of its
// group die too.
func TestRunGroupDiesWithFenced(t *testing.T) {
	store := tempStore(t)
	dir := t.TempDir()
	leaderFile, childFile := filepath.Join(dir, "leader"), filepath.Join(dir, "child")
	script := fmt.Sprintf(`echo $$ > %s; sleep 30 & echo $! > %s; wait`, leaderFile, childFile)
	cmd, _, _ := startRun(t, store, "run", "job:die", "--", "sh", "-c", script)
	leader, child := readPid(t, leaderFile), readPid(t, childFile)
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	eventually(t, 10*time.Second, "COMMAND survived fenced's death", func() bool { return !alive(leader) })
	eventually(t, 10*time.Second, "COMMAND's child survived fenced's death", func() bool { return !alive(child) })
}

// Issue 9 item 4: COMMAND exits 0 right after its lease was broken, before
// fenced's next renewal would notice: the exit code is 77, not 0. A
// COMMAND's own 77 passes through without fenced's "(exit 77)" line.
func TestRunLostBeforeExitIs77(t *testing.T) {
	store := tempStore(t)
	goFile := filepath.Join(t.TempDir(), "go")
	script := fmt.Sprintf(`while [ ! -e %s ]; do sleep 0.01; done; exit 0`, goFile)
	// TTL 30s: the next renewal is 10s away, so only a final check can
	// notice the break.
	cmd, _, errb := startRun(t, store, "run", "job:late", "--", "sh", "-c", script)
	waitHeld(t, client(t, store), "job:late")
	if _, err := client(t, store).Break(context.Background(), "job:late", "test", "test"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code := waitExit(t, cmd, 20*time.Second); code != 77 {
		t.Fatalf("COMMAND exited 0 after its lease was broken: fenced exit %d, want 77; stderr %s", code, errb)
	}
	if !strings.Contains(errb.String(), "(exit 77)") {
		t.Fatalf("fenced's 77 without its exit line: %s", errb)
	}

	r := cli(t, store, "run", "job:own", "--", "sh", "-c", "exit 77")
	if r.code != 77 || strings.Contains(r.stderr, "(exit") {
		t.Fatalf("COMMAND's own 77: exit %d, stderr %q; want 77 and no fenced exit line", r.code, r.stderr)
	}
}

// Issue 9 item 5 and issue 16 item 16: COMMAND gets the owner digest that
// fence.From sends (never the owner token), and the store URL without its
// password; FENCED_ variables it would inherit are replaced.
func TestChildEnv(t *testing.T) {
	l, err := client(t, tempStore(t)).TryAcquire(context.Background(), "job:env", nil)
	if err != nil {
		t.Fatal(err)
	}
	env := childEnv([]string{"PATH=/bin", "FENCED_OWNER=stale", "FENCED_STORE=postgres://u:secret@db/app"}, l, "postgres://u:secret@db/app?sslpassword=secret2")
	got := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		if _, dup := got[k]; dup {
			t.Fatalf("%s twice in %q", k, env)
		}
		got[k] = v
		if strings.Contains(v, l.Owner()) || strings.Contains(v, "secret") {
			t.Fatalf("%s leaks a secret: %q", k, kv)
		}
	}
	if want := fence.From(l).Owner; got["FENCED_OWNER"] != want {
		t.Fatalf("FENCED_OWNER = %q, want fence.From's %q", got["FENCED_OWNER"], want)
	}
	if got["FENCED_FENCE"] != strconv.FormatUint(l.Fence(), 10) || got["FENCED_KEY"] != "job:env" || got["PATH"] != "/bin" {
		t.Fatalf("env %q", env)
	}
	if !strings.HasPrefix(got["FENCED_STORE"], "postgres://u:") || !strings.Contains(got["FENCED_STORE"], "@db/app") {
		t.Fatalf("FENCED_STORE = %q, want the URL with the password redacted", got["FENCED_STORE"])
	}
}

// Issue 9 item 5 from the command line: FENCED_OWNER is an owner digest,
// another one for every grant.
func TestRunExportsOwnerDigest(t *testing.T) {
	store := tempStore(t)
	digest := regexp.MustCompile(`^[0-9a-f]{32}$`)
	var seen []string
	for range 2 {
		r := cli(t, store, "run", "job:owner", "--", "sh", "-c", `echo "$FENCED_OWNER"`)
		owner := strings.TrimSpace(r.stdout)
		if r.code != 0 || !digest.MatchString(owner) {
			t.Fatalf("exit %d, FENCED_OWNER %q; want a 32-hex digest (stderr %s)", r.code, owner, r.stderr)
		}
		seen = append(seen, owner)
	}
	if seen[0] == seen[1] {
		t.Fatal("two grants, one FENCED_OWNER")
	}
}

// Issue 16 item 16: after KEY everything is COMMAND, with or without "--";
// flags after KEY still work before a "--".
func TestRunCommandWithoutDashDash(t *testing.T) {
	t.Parallel()
	store := tempStore(t)
	if r := cli(t, store, "run", "job:x", "sh", "-c", "echo hi"); r.code != 0 || r.stdout != "hi\n" {
		t.Fatalf("run job:x sh -c 'echo hi': exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if r := cli(t, store, "run", "--ttl", "5s", "job:x", "--", "sh", "-c", "echo -- $FENCED_FENCE"); r.code != 0 || r.stdout != "-- 2\n" {
		t.Fatalf("with --: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if r := cli(t, store, "run", "job:x", "--ttl", "5s", "--", "true"); r.code != 0 {
		t.Fatalf("flags between KEY and --: exit %d, stderr %q", r.code, r.stderr)
	}
	if r := cli(t, store, "run", "job:x", "--ttl", "5s", "true"); r.code != 64 || !strings.Contains(r.stderr, "--") {
		t.Fatalf("flags after KEY without --: exit %d, stderr %q; want 64 saying to add --", r.code, r.stderr)
	}
	if r := cli(t, store, "run", "job:x", "--ttl", "5s", "extra", "--", "true"); r.code != 64 || !strings.Contains(r.stderr, "one KEY") {
		t.Fatalf("two words before --: exit %d, stderr %q", r.code, r.stderr)
	}
}

// Issue 9 item 15: the default store is per user; -v names the file used
// and run --help says so.
func TestRunVerboseNamesPerUserStore(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	cmd := exec.Command(os.Args[0], "-v", "run", "job:v", "--", "true")
	cmd.Env = append(os.Environ(), "FENCED_TEST_AS_CLI=1", "FENCED_STORE=", "XDG_STATE_HOME="+state)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v: %s", err, errb.String())
	}
	if want := filepath.Join(state, "fenced", "fenced.db"); !strings.Contains(errb.String(), want) || !strings.Contains(errb.String(), "per user") {
		t.Fatalf("-v: stderr %q; want the default store %s, per user", errb.String(), want)
	}
	if r := cli(t, tempStore(t), "run", "--help"); !strings.Contains(r.stdout, "invoking user") {
		t.Fatalf("run --help does not say the default store is per user:\n%s", r.stdout)
	}
}

// Issue 9, small ones: --ttl 0 is refused, not silently 30s.
func TestRunRefusesZeroTTL(t *testing.T) {
	t.Parallel()
	marker := filepath.Join(t.TempDir(), "ran")
	if r := cli(t, tempStore(t), "run", "--ttl", "0", "job:t", "--", "touch", marker); r.code != 64 || !strings.Contains(r.stderr, "--ttl") {
		t.Fatalf("--ttl 0: exit %d, stderr %q; want 64 naming --ttl", r.code, r.stderr)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the command ran with --ttl 0")
	}
}

// Issue 9, small ones: break of a never-granted key says not found; of a
// free key, that no one holds it.
func TestBreakNeverGrantedSaysNotFound(t *testing.T) {
	t.Parallel()
	store := tempStore(t)
	if r := cli(t, store, "break", "never:granted", "--reason", "x"); r.code == 0 || !strings.Contains(r.stderr, "not found") {
		t.Fatalf("break of a never-granted key: exit %d, stderr %q; want not found", r.code, r.stderr)
	}
	if r := cli(t, store, "run", "job:b", "--", "true"); r.code != 0 {
		t.Fatal(r.stderr)
	}
	if r := cli(t, store, "break", "job:b", "--reason", "x"); r.code == 0 || strings.Contains(r.stderr, "not found") || !strings.Contains(r.stderr, "no one holds it") {
		t.Fatalf("break of a free key: exit %d, stderr %q; want nothing held", r.code, r.stderr)
	}
}

// openPTY opens a pseudo-terminal pair.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	s, err := os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close(); s.Close() })
	return m, s
}

// startOnTerminal starts `fenced run ...` as the session leader of a new
// pseudo-terminal, in its foreground, as a login shell's job would be. It
// returns the command and a function returning everything the terminal
// showed so far.
func startOnTerminal(t *testing.T, store string, args ...string) (*exec.Cmd, *os.File, func() string) {
	t.Helper()
	master, slave := openPTY(t)
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = cliEnv(t, store)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	slave.Close()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
	})
	shown := &syncBuffer{}
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := master.Read(buf)
			shown.Write(buf[:n])
			if err != nil { // EIO once no process has the terminal open
				return
			}
		}
	}()
	return cmd, master, shown.String
}

// Issue 9 item 3: an interactive COMMAND gets the terminal: it reads a
// line; Ctrl-Z stops it and fenced, the shell's fg (SIGCONT to fenced)
// gives the terminal back to it, and it reads on.
func TestRunTerminal(t *testing.T) {
	store := tempStore(t)
	script := `printf 'name? '; read a; echo "first $a"; read b; echo "second $b"`
	cmd, term, shown := startOnTerminal(t, store, "run", "job:tty", "--", "sh", "-c", script)
	eventually(t, 20*time.Second, "no prompt", func() bool { return strings.Contains(shown(), "name? ") })
	if _, err := term.WriteString("alice\n"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "COMMAND could not read the terminal", func() bool { return strings.Contains(shown(), "first alice") })

	if _, err := term.WriteString("\x1a"); err != nil { // Ctrl-Z
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "fenced did not stop on Ctrl-Z", func() bool { return stopped(cmd.Process.Pid) })
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil { // fg
		t.Fatal(err)
	}
	if _, err := term.WriteString("bob\n"); err != nil {
		t.Fatal(err)
	}
	if code := waitExit(t, cmd, 20*time.Second); code != 0 {
		t.Fatalf("exit %d; terminal:\n%s", code, shown())
	}
	eventually(t, 5*time.Second, "COMMAND did not read on after fg", func() bool { return strings.Contains(shown(), "second bob") })
}
