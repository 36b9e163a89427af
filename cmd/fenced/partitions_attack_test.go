package main

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
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
