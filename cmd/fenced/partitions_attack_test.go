package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/cli/proof"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// Supervision of `fenced partitions run` under attack: a one-partition
// member runs the attacker (every escape: setsid, double fork, a writing
// thread whose main thread exited, SIGTERM ignored, a process that stops
// itself) against Redis through a proxy, and the member is attacked: its
// link is black-holed (the partition's lease is lost unrenewed), it is
// stopped with SIGSTOP (nothing renews, and the pipe to the partition's
// supervisor stays open), or it is killed with kill -9. A new holder polls
// the partition's key directly; checked, by the attempts each process
// logs before writing, in both supervision modes: no write with the old
// fence is attempted after the new holder's grant, and no escapee is left.
//
// --grace is just under --ttl, so the checks also see that the grace is
// cut to the validity left: a dead member's commands get SIGKILL at once,
// not after --grace (which would outlast the lease's expiry).
func TestPartitionsRunUnderAttack(t *testing.T) {
	if testing.Short() {
		t.Skip("long: partitions run under loss, SIGSTOP and kill -9 in both modes; run without -short")
	}
	bin := attackerBin(t)
	for _, attack := range []string{"loss", "sigstop", "kill-9"} {
		t.Run(attack, func(t *testing.T) {
			inMode(t, func(t *testing.T, mode string) { partitionsAttack(t, bin, attack, mode) })
		})
	}
}

func partitionsAttack(t *testing.T, bin, attack, mode string) {
	const ttl, grace = 3 * time.Second, 2990 * time.Millisecond
	r := testenv.StartRedis(t, testenv.RedisConfig{})
	px := testenv.StartProxy(t, r.Addr())
	viaProxy := strings.Replace(r.URL(), r.Addr(), px.Addr, 1)
	dir := t.TempDir()
	out, pids := filepath.Join(dir, "attempts"), filepath.Join(dir, "pids")
	cmd, _, errb := startRun(t, viaProxy, "-v", "partitions", "run", "--min-fence", "repeatable", "g", "-p", "1",
		"--ttl", ttl.String(), "--grace", grace.String(), "--id", "a", "--", bin, out, pids, "10")
	checkMode(t, errb, mode)
	old := startedAttacker(t, out, pids)

	switch attack {
	case "loss":
		px.BlackHole(true)
		t.Cleanup(func() { px.BlackHole(false) })
	case "sigstop":
		if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Signal(syscall.SIGCONT) })
	case "kill-9":
		if err := cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
	}
	grantT, grantOff, newFence := awaitNewHolder(t, client(t, r.URL()), "g/p/0", out, old,
		&fenced.LeaseOptions{TTL: 30 * time.Second, MinFence: fenced.FenceRepeatable}, "member's "+attack, ttl, errb)
	time.Sleep(time.Second) // an escapee would write on meanwhile
	late, n, alive := attackOutcome(t, out, pids, old, grantT, grantOff)
	t.Logf("%s, member's %s: %d attempts with fence %s; new holder's fence %d; attempts after its grant by kind %v; alive after: %v", mode, attack, n, old, newFence, late, alive)
	if len(late) > 0 {
		t.Errorf("%s, member's %s: writes with the old fence %s attempted after the new holder's grant (fence %d): %v", mode, attack, old, newFence, late)
	}
	if len(alive) > 0 {
		t.Errorf("%s, member's %s: escapees alive after the new holder's grant: %v", mode, attack, alive)
	}
}

// --grace must be shorter than --ttl: a command is killed before its
// partition's lease runs out, so a longer grace would never be given.
func TestPartitionsRunGraceBelowTTL(t *testing.T) {
	cmd, _, errb := startRun(t, tempStore(t), "partitions", "run", "g", "-p", "1", "--ttl", "3s", "--grace", "5s", "--", "true")
	code := waitExit(t, cmd, 20*time.Second) // a member that accepts the flags runs until stopped
	if s := errb.String(); code != exitUsage || !strings.Contains(s, "--grace 5s") || !strings.Contains(s, "--ttl 3s") {
		t.Fatalf("--ttl 3s --grace 5s: exit %d, stderr %q; want 64 naming both flags", code, s)
	}
}

// startSupervisor starts `fenced partitions supervise --grace GRACE` on the
// attacker, as a member would, with the validity valid (CLOCK_MONOTONIC
// ns) as its first line, and returns the pipe's write end, the
// supervisor, its stderr, and the attacker's files and fence.
func startSupervisor(t *testing.T, bin, grace string, valid int64) (w *os.File, cmd *exec.Cmd, errb outFile, out, pids string) {
	t.Helper()
	dir := t.TempDir()
	out, pids = filepath.Join(dir, "attempts"), filepath.Join(dir, "pids")
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	if _, err := fmt.Fprintf(w, "valid %d\n", valid); err != nil {
		t.Fatal(err)
	}
	cmd, _, _ = cliCmd(t, "", "-v", "partitions", "supervise", "--grace", grace,
		"--env", "FENCED_FENCE=1", "--env", "FENCED_KEY=g/p/0", "--env", "FENCED_PARTITION=0", "--", bin, out, pids, "10")
	errb = outFile(filepath.Join(dir, "stderr"))
	ef, err := os.Create(string(errb))
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	cmd.Stdout, cmd.Stderr, cmd.ExtraFiles = nil, ef, []*os.File{r}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r.Close()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	return w, cmd, errb, out, pids
}

// The supervisor of a partition's command bounds --grace: told of a loss
// ("end lost") with less than 6s of validity left and --grace 8s, it
// kills the attacker (which ignores SIGTERM) before the validity ends,
// not after --grace; when the member dies (the pipe closes without a word) with a
// minute of validity left and --grace 10s, it kills at once, well within
// half the grace (the bound excludes waiting for the grace, nothing
// finer).
func TestPartitionSupervisorBoundsGrace(t *testing.T) {
	if testing.Short() {
		t.Skip("long: the supervisor bounds grace after loss, SIGSTOP and kill; run without -short")
	}
	bin := attackerBin(t)
	t.Run("lost", func(t *testing.T) {
		inMode(t, func(t *testing.T, mode string) {
			end := proof.Now() + int64(6*time.Second)
			w, cmd, errb, out, pids := startSupervisor(t, bin, "8s", end)
			checkMode(t, errb, mode)
			startedAttacker(t, out, pids)
			if _, err := fmt.Fprintf(w, "end lost:test: broken\n"); err != nil {
				t.Fatal(err)
			}
			if code := waitExit(t, cmd, 20*time.Second); code != exitLost {
				t.Errorf("supervisor exited %d, want %d; stderr %s", code, exitLost, errb)
			}
			late := 0
			for _, a := range readAttempts(t, out) {
				if a.t >= end {
					late++
				}
			}
			if late > 0 {
				t.Errorf("%s: %d attempts after the validity the member sent had ended (--grace 8s outlasted it); stderr %s", mode, late, errb)
			}
		})
	})
	t.Run("member-died", func(t *testing.T) {
		inMode(t, func(t *testing.T, mode string) {
			const grace = 10 * time.Second
			w, cmd, errb, out, pids := startSupervisor(t, bin, grace.String(), proof.Now()+int64(time.Minute))
			checkMode(t, errb, mode)
			startedAttacker(t, out, pids)
			w.Close()
			died := time.Now()
			code := waitExit(t, cmd, 30*time.Second)
			if took := time.Since(died); took > grace/2 {
				t.Errorf("%s: the tree was gone %v after the member died, want SIGKILL at once (--grace %v not waited for); stderr %s", mode, took.Round(time.Millisecond), grace, errb)
			}
			if code != exitLost {
				t.Errorf("supervisor exited %d, want %d; stderr %s", code, exitLost, errb)
			}
			for kind, pid := range attackerPids(pids) {
				if threadsAlive(pid) {
					t.Errorf("%s: %s (%d) alive after the supervisor exited", mode, kind, pid)
				}
			}
		})
	})
}
