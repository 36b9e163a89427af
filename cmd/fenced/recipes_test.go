package main

import (
	"bufio"
	"encoding/json"
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

	"github.com/fenced-dev/fenced/drivertest"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// Tests of the recipes through the CLI, with real processes: fenced elect
// and observe, run -n, run with several keys, and --min-hold (issue 14).

// marks reads the files dir/PREFIX.* that COMMANDs write, each holding
// "EPOCH_OR_SLOT FENCE FENCED_PID PID", and returns their fields.
func marks(dir, prefix string) [][4]string {
	names, _ := filepath.Glob(filepath.Join(dir, prefix+".*"))
	var out [][4]string
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			continue
		}
		f := strings.Fields(string(b))
		if len(f) == 4 {
			out = append(out, [4]string{f[0], f[1], f[2], f[3]})
		}
	}
	return out
}

// sampleAlive counts, every 10ms until stop is closed, the COMMANDs among
// marks(dir, prefix) that are alive, and returns the largest count seen.
func sampleAlive(dir, prefix string, stop <-chan struct{}) <-chan int {
	res := make(chan int, 1)
	go func() {
		most := 0
		for {
			n := 0
			for _, m := range marks(dir, prefix) {
				if pid, _ := strconv.Atoi(m[3]); alive(pid) {
					n++
				}
			}
			most = max(most, n)
			select {
			case <-stop:
				res <- most
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	return res
}

// testElectFailover runs three `fenced elect` on store and an observer,
// kills the leader's fenced with SIGKILL, and checks that exactly one
// COMMAND ran at any time, that another candidate led within bound with a
// higher epoch, and that observe printed the first leader, "no leader" and
// the second leader, in that order.
func testElectFailover(t *testing.T, store string, bound time.Duration) {
	dir := t.TempDir()
	obs, obsOut, _ := startRun(t, store, "observe", "-o", "json", "svc")
	var electors []*exec.Cmd
	for range 3 {
		cmd, _, _ := startRun(t, store, "elect", "--ttl", "1s", "--grace", "1s", "svc", "--",
			"sh", "-c", `echo "$FENCED_EPOCH $FENCED_FENCE $PPID $$" > "`+dir+`/lead.$FENCED_EPOCH"; exec sleep 1000`)
		electors = append(electors, cmd)
	}
	stop := make(chan struct{})
	most := sampleAlive(dir, "lead", stop)
	eventually(t, 30*time.Second, "nobody led", func() bool { return len(marks(dir, "lead")) == 1 })
	first := marks(dir, "lead")[0]
	if first[0] != first[1] {
		t.Fatalf("FENCED_EPOCH %s != FENCED_FENCE %s", first[0], first[1])
	}
	e1, _ := strconv.ParseUint(first[0], 10, 64)
	leaderFenced, _ := strconv.Atoi(first[2])
	// observe sees the first leader before it is killed. Under load the
	// observer may still be opening the store (it stands in line for the
	// init lock behind the candidates): it is waited for, not assumed.
	eventually(t, 30*time.Second, fmt.Sprintf("observe did not show leader %d", e1), func() bool {
		return strings.Contains(obsOut.String(), fmt.Sprintf(`"leader":true,"epoch":%d,`, e1))
	})
	if err := syscall.Kill(leaderFenced, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	var second [4]string
	eventually(t, 30*time.Second, "no second leader after kill -9 of the first's fenced", func() bool {
		for _, m := range marks(dir, "lead") {
			if m != first {
				second = m
				return true
			}
		}
		return false
	})
	took := time.Since(killed)
	e2, _ := strconv.ParseUint(second[0], 10, 64)
	t.Logf("second leader (epoch %d after %d) %v after kill -9; bound %v", e2, e1, took.Round(time.Millisecond), bound)
	if e2 <= e1 {
		t.Fatalf("second epoch %d not above the first's %d", e2, e1)
	}
	if took > bound {
		t.Errorf("second leader after %v, more than %v", took, bound)
	}
	time.Sleep(500 * time.Millisecond)
	close(stop)
	if n := <-most; n != 1 {
		t.Fatalf("%d COMMANDs of fenced elect ran at once", n)
	}
	for _, c := range electors {
		_ = c.Process.Signal(syscall.SIGTERM)
	}
	for _, c := range electors {
		waitExit(t, c, 20*time.Second)
	}
	_ = obs.Process.Signal(syscall.SIGINT)
	waitExit(t, obs, 10*time.Second)

	var lines []leaderJSON
	sc := bufio.NewScanner(strings.NewReader(obsOut.String()))
	for sc.Scan() {
		var l leaderJSON
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("observe printed %q: %v", sc.Text(), err)
		}
		lines = append(lines, l)
	}
	// Find leader e1, then a no-leader line, then leader e2.
	step := 0
	for _, l := range lines {
		switch {
		case step == 0 && l.Leader && l.Epoch == e1:
			step = 1
		case step == 1 && !l.Leader:
			step = 2
		case step == 2 && l.Leader && l.Epoch == e2:
			step = 3
		}
	}
	if step != 3 {
		t.Fatalf("observe printed %s; want leader %d, no leader, leader %d in order", obsOut, e1, e2)
	}
}

// Issue 14: three fenced elect on SQLite, kill -9 of the leader's fenced.
func TestElectFailoverSQLite(t *testing.T) {
	ttl := time.Second
	testElectFailover(t, tempStore(t), ttl+ttl/3+2*time.Second)
}

// Issue 14: the same on etcd, whose sessions outlive a grant by up to one
// second of headroom (see package etcd).
func TestElectFailoverEtcd(t *testing.T) {
	t.Parallel()
	cluster := testenv.StartEtcd(t)
	ttl := time.Second
	testElectFailover(t, cluster.URL("prefix=elections/"), ttl+time.Second+ttl/3+2*time.Second)
}

// Issue 14: etcdctl elect and fenced elect on one etcd election name
// exclude each other in both directions, and each sees the other's value.
func TestElectInteropsWithEtcdctlElect(t *testing.T) {
	etcdctl := testenv.RequireBinary(t, "etcd-client", "etcdctl")
	cluster := testenv.StartEtcd(t)
	store := cluster.URL("prefix=elections/")
	endpoints := "--endpoints=" + strings.Join(cluster.Endpoints(), ",")
	dir := t.TempDir()
	ctl := func(args ...string) (*exec.Cmd, outFile) {
		cmd := exec.Command(etcdctl, append([]string{endpoints}, args...)...)
		cmd.Env = append(os.Environ(), "ETCDCTL_API=3")
		out := outFile(filepath.Join(t.TempDir(), "out"))
		f, err := os.Create(string(out))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		cmd.Stdout, cmd.Stderr = f, f
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd, out
	}

	// etcdctl leads; fenced elect waits, and fenced observe shows etcdctl's
	// proposal.
	leader, leaderOut := ctl("elect", "elections/svc", "from-etcdctl")
	eventually(t, 20*time.Second, "etcdctl was not elected", func() bool { return strings.Contains(leaderOut.String(), "from-etcdctl") })
	fe, _, _ := startRun(t, store, "elect", "--ttl", "2s", "--value", "from-fenced", "svc", "--",
		"sh", "-c", `echo "$FENCED_EPOCH" > "`+dir+`/epoch"; exec sleep 1000`)
	obs, obsOut, _ := startRun(t, store, "observe", "svc")
	eventually(t, 10*time.Second, "observe did not show etcdctl's leader", func() bool { return strings.Contains(obsOut.String(), `"from-etcdctl"`) })
	time.Sleep(time.Second)
	if _, err := os.Stat(filepath.Join(dir, "epoch")); err == nil {
		t.Fatal("fenced elect ran COMMAND while etcdctl led")
	}
	_ = leader.Process.Signal(syscall.SIGINT) // etcdctl resigns
	eventually(t, 20*time.Second, "fenced elect did not lead after etcdctl resigned", func() bool {
		_, err := os.Stat(filepath.Join(dir, "epoch"))
		return err == nil
	})

	// fenced leads; etcdctl elect -l shows fenced's value, and a second
	// etcdctl candidate is not elected until fenced resigns.
	listen, listenOut := ctl("elect", "-l", "elections/svc")
	defer listen.Process.Kill()
	eventually(t, 10*time.Second, "etcdctl elect -l did not show fenced's value", func() bool { return strings.Contains(listenOut.String(), "from-fenced") })
	cand, candOut := ctl("elect", "elections/svc", "second-etcdctl")
	time.Sleep(1500 * time.Millisecond)
	if strings.Contains(candOut.String(), "second-etcdctl") {
		t.Fatalf("etcdctl was elected while fenced led: %s", candOut)
	}
	_ = fe.Process.Signal(syscall.SIGTERM) // COMMAND ends, fenced resigns
	waitExit(t, fe, 20*time.Second)
	eventually(t, 20*time.Second, "etcdctl was not elected after fenced resigned", func() bool { return strings.Contains(candOut.String(), "second-etcdctl") })
	eventually(t, 10*time.Second, "observe did not show the second etcdctl", func() bool { return strings.Contains(obsOut.String(), `"second-etcdctl"`) })
	_ = cand.Process.Signal(syscall.SIGINT)
	_ = obs.Process.Signal(syscall.SIGINT)
	waitExit(t, obs, 10*time.Second)
	t.Logf("observe:\n%s", obsOut)
}

// Issue 14: five fenced run -n 3 at once: never more than three COMMANDs,
// distinct fences per permit; a kill -9 of one holder frees its permit
// after its TTL.
func TestRunSemaphore(t *testing.T) {
	t.Parallel()
	store := tempStore(t)
	measured := drivertest.StoreTTL(t, store, 5, time.Second)
	ttl := measured.String()
	// Processes that open the file at once queue for its setup lock, each
	// behind the others' waits for SQLite's write lock: on a loaded
	// machine that outlasts the default 5s busy timeout. The wait follows
	// the machine as the TTL does.
	store += "?busy_timeout=" + max(5*time.Second, 2*measured).String()
	dir := t.TempDir()
	stop := make(chan struct{})
	most := sampleAlive(dir, "in", stop)
	var wg sync.WaitGroup
	for range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := cli(t, store, "run", "-n", "3", "--ttl", ttl, "--wait", "30s", "pool", "--",
				"sh", "-c", `echo "$FENCED_SLOT $FENCED_FENCE $PPID $$" > "`+dir+`/in.$FENCED_SLOT.$FENCED_FENCE"; sleep 0.5`)
			if r.code != 0 {
				t.Errorf("run -n 3: exit %d, stderr %s", r.code, r.stderr)
			}
		}()
	}
	wg.Wait()
	close(stop)
	if n := <-most; n > 3 || n == 0 {
		t.Fatalf("%d COMMANDs of run -n 3 at once", n)
	}
	if ms := marks(dir, "in"); len(ms) != 5 {
		t.Fatalf("%d distinct (slot, fence) pairs for 5 runs: %v", len(ms), ms)
	}

	// Three holders; a fourth waits; kill -9 of one holder's fenced frees
	// its permit after its TTL.
	hold := t.TempDir()
	for range 3 {
		startRun(t, store, "run", "-n", "3", "--ttl", ttl, "pool", "--",
			"sh", "-c", `echo "$FENCED_SLOT $FENCED_FENCE $PPID $$" > "`+hold+`/h.$FENCED_SLOT"; exec sleep 1000`)
	}
	eventually(t, 20*time.Second, "three holders did not start", func() bool { return len(marks(hold, "h")) == 3 })
	if r := cli(t, store, "run", "-n", "3", "pool", "--", "true"); r.code != 75 {
		t.Fatalf("run -n 3 with three holders: exit %d, want 75", r.code)
	}
	waiter, out, _ := startRun(t, store, "run", "-n", "3", "--ttl", ttl, "--wait", "30s", "pool", "--",
		"sh", "-c", `echo "$FENCED_SLOT $FENCED_FENCE"`)
	victim := marks(hold, "h")[0]
	pid, _ := strconv.Atoi(victim[2])
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if code := waitExit(t, waiter, 30*time.Second); code != 0 {
		t.Fatalf("waiter exit %d", code)
	}
	f := strings.Fields(out.String())
	if len(f) != 2 || f[0] != victim[0] {
		t.Fatalf("waiter got %q; want the killed holder's slot %s", out, victim[0])
	}
	if a, _ := strconv.Atoi(f[1]); a <= mustAtoi(victim[1]) {
		t.Fatalf("waiter fence %s not above the killed holder's %s", f[1], victim[1])
	}
}

func mustAtoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		panic(err)
	}
	return n
}

// Issue 14: run a b and run b a in loops, waiting: no deadlock, no
// overlap (mkdir fails if another COMMAND is inside), and FENCED_FENCES.
func TestRunSeveralKeys(t *testing.T) {
	store := tempStore(t)
	crit := filepath.Join(t.TempDir(), "crit")
	var wg sync.WaitGroup
	for _, keys := range [][]string{{"a", "b"}, {"b", "a"}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 4 {
				args := append(append([]string{"run", "--ttl", "2s", "--wait", "60s"}, keys...), "--",
					"sh", "-c", `mkdir "`+crit+`" || exit 99; sleep 0.05; rmdir "`+crit+`"`)
				if r := cli(t, store, args...); r.code != 0 {
					t.Errorf("run %v: exit %d (99: two COMMANDs inside at once), stderr %s", keys, r.code, r.stderr)
					return
				}
			}
		}()
	}
	wg.Wait()
	r := cli(t, store, "run", "b", "a", "--", "sh", "-c", `echo "$FENCED_FENCES"; echo "${FENCED_FENCE-unset}"`)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	var fences map[string]uint64
	if r.code != 0 || len(lines) != 2 || json.Unmarshal([]byte(lines[0]), &fences) != nil || fences["a"] == 0 || fences["b"] == 0 || lines[1] != "unset" {
		t.Fatalf("run b a: exit %d, stdout %q; want FENCED_FENCES with a and b, FENCED_FENCE unset", r.code, r.stdout)
	}
	if r := cli(t, store, "run", "-n", "2", "a", "b", "--", "true"); r.code != 64 {
		t.Fatalf("-n with two keys: exit %d, want 64", r.code)
	}
	if r := cli(t, store, "run", "a", "a", "--", "true"); r.code != 64 {
		t.Fatalf("a key named twice: exit %d, want 64; stderr %s", r.code, r.stderr)
	}
}

// Issue 14: --min-hold keeps the lease after COMMAND ends, so a late
// duplicate is skipped with 75; after the hold the key is free.
func TestRunMinHold(t *testing.T) {
	store := tempStore(t)
	done := filepath.Join(t.TempDir(), "done")
	// The duplicate must start within the hold: the hold is 3 s, or five
	// times what a whole run takes here if more (a busy machine).
	probe := time.Now()
	if r := cli(t, store, "run", "probe", "--", "true"); r.code != 0 {
		t.Fatalf("probe run: exit %d, stderr %s", r.code, r.stderr)
	}
	hold := max(3*time.Second, 5*time.Since(probe))
	first, _, _ := startRun(t, store, "run", "--ttl", "1s", "--min-hold", hold.String(), "cron:daily", "--", "touch", done)
	eventually(t, 20*time.Second, "first run did not run", func() bool { _, err := os.Stat(done); return err == nil })
	ran := time.Now()
	if r := cli(t, store, "run", "cron:daily", "--", "echo", "RAN"); r.code != 75 || strings.Contains(r.stdout, "RAN") {
		t.Fatalf("duplicate %v after the first run ran, within --min-hold %v: exit %d, stdout %q; want 75",
			time.Since(ran).Round(time.Millisecond), hold, r.code, r.stdout)
	}
	if code := waitExit(t, first, hold+20*time.Second); code != 0 {
		t.Fatalf("first run exit %d", code)
	}
	if r := cli(t, store, "run", "cron:daily", "--", "echo", "RAN"); r.code != 0 || r.stdout != "RAN\n" {
		t.Fatalf("run after the hold: exit %d, stdout %q", r.code, r.stdout)
	}
	if r := cli(t, store, "run", "--min-hold", "5s", "--max-hold", "1s", "x", "--", "true"); r.code != 64 {
		t.Fatalf("--min-hold above --max-hold: exit %d, want 64", r.code)
	}
}
