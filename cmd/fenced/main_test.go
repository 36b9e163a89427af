package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/cli/supervise"
)

// The test binary doubles as the fenced binary: with FENCED_TEST_AS_CLI=1
// it runs main's logic, so tests see real exit codes and real processes.
// Tests that only check what commands say and do, with no time bound,
// run in parallel (t.Parallel). Those that time a supervisor against a
// lease's validity run one at a time: several at once starve each other
// on a busy machine.
func TestMain(m *testing.M) {
	supervise.MaybeRunGuard()
	if os.Getenv("FENCED_TEST_AS_CLI") == "1" {
		os.Exit(traceExit(execute(os.Args[1:], os.Stdout, os.Stderr)))
	}
	code := m.Run()
	if product.dir != "" {
		os.RemoveAll(product.dir)
	}
	os.Exit(code)
}

// product is the fenced binary users run, built once by productBin.
var product struct {
	once      sync.Once
	dir, path string
	err       error
}

// productBin returns this package built as a release is, once per test
// binary: without -race, cgo off, -trimpath (the configuration
// scripts/test.sh vets in, so its dependencies are compiled already). The
// attack tests run it as the supervisor and guard whose kills they time
// against a lease. The race detector's runtime slows and delays a process
// in ways no user's fenced sees: under load a race-built guard woke up to
// 1.6 s past its deadline, a plain one within 1 ms (docs/supervision.md).
// The other tests run this test binary, so the race detector still checks
// the supervisor's code in them.
func productBin(t *testing.T) string {
	t.Helper()
	product.once.Do(func() {
		if product.dir, product.err = os.MkdirTemp("", "fenced-product-"); product.err != nil {
			return
		}
		path := filepath.Join(product.dir, "fenced")
		var flags []string
		for _, f := range strings.Fields(os.Getenv("GOFLAGS")) {
			if f != "-race" && f != "--race" {
				flags = append(flags, f)
			}
		}
		build := exec.Command("go", "build", "-trimpath", "-o", path, ".")
		build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS="+strings.Join(flags, " "))
		if out, err := build.CombinedOutput(); err != nil {
			product.err = fmt.Errorf("go build -trimpath -o %s . (CGO_ENABLED=0 GOFLAGS=%q): %v\n%s", path, strings.Join(flags, " "), err, out)
			return
		}
		product.path = path
	})
	if product.err != nil {
		t.Fatal(product.err)
	}
	return product.path
}

type result struct {
	code           int
	stdout, stderr string
}

// cliCmd returns a fenced command of this test binary (see TestMain).
func cliCmd(t *testing.T, store string, args ...string) (*exec.Cmd, *bytes.Buffer, *bytes.Buffer) {
	t.Helper()
	return cliCmdOf(t, os.Args[0], store, args...)
}

// cliCmdOf returns a fenced command of binary bin: this test binary or
// productBin's.
func cliCmdOf(t *testing.T, bin, store string, args ...string) (*exec.Cmd, *bytes.Buffer, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = cliEnv(t, store)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	return cmd, &out, &errb
}

// cliEnv is the environment of a fenced started by t: this process's,
// the store, and the supervision mode inMode chose for t, if any.
func cliEnv(t *testing.T, store string) []string {
	env := append(os.Environ(), "FENCED_TEST_AS_CLI=1", "FENCED_STORE="+store, supervise.TraceEnv+"=1")
	if mode, ok := modeOf(t); ok {
		env = append(env, supervise.ModeEnv+"="+mode)
	}
	return env
}

func cli(t *testing.T, store string, args ...string) result {
	t.Helper()
	cmd, out, errb := cliCmd(t, store, args...)
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return result{code, out.String(), errb.String()}
}

func tempStore(t *testing.T) string {
	return "sqlite://" + filepath.Join(t.TempDir(), "leases.db")
}

func client(t *testing.T, store string) *fenced.Client {
	t.Helper()
	c, err := fenced.Open(context.Background(), store, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestRunGivesChildKeyFenceStore(t *testing.T) {
	store := tempStore(t)
	for want := 1; want <= 2; want++ {
		r := cli(t, store, "run", "job:a", "--", "sh", "-c", `echo "$FENCED_KEY $FENCED_FENCE $FENCED_STORE"`)
		if r.code != 0 {
			t.Fatalf("exit %d, stderr %s", r.code, r.stderr)
		}
		if got, wantOut := strings.TrimSpace(r.stdout), "job:a "+string(rune('0'+want))+" "+store; got != wantOut {
			t.Fatalf("child saw %q, want %q", got, wantOut)
		}
	}
	// The lease was released: nothing is held.
	if l, _ := client(t, store).List(context.Background(), ""); len(l) != 0 {
		t.Fatalf("lease still held after run: %+v", l)
	}
}

func TestRunExitsWithChildCode(t *testing.T) {
	store := tempStore(t)
	if r := cli(t, store, "run", "job:b", "--", "sh", "-c", "exit 3"); r.code != 3 {
		t.Fatalf("exit %d, want the child's 3 (stderr %s)", r.code, r.stderr)
	}
	if r := cli(t, store, "run", "job:b", "--", "/nonexistent/command"); r.code != 127 || !strings.Contains(r.stderr, "/nonexistent/command") {
		t.Fatalf("missing command: exit %d, stderr %q; want 127 naming it", r.code, r.stderr)
	}
}

func TestRunHeldExits75AndRunsNothing(t *testing.T) {
	store := tempStore(t)
	ctx := context.Background()
	l, err := client(t, store).TryAcquire(ctx, "job:held", nil)
	if err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(t.TempDir(), "ran")
	// The wait covers the store's open too: at least three times what an
	// open and an inspect take on this machine now, so that the wait
	// runs out on the held key.
	began := time.Now()
	if r := cli(t, store, "inspect", "job:held"); r.code != 0 {
		t.Fatalf("inspect: exit %d, stderr %s", r.code, r.stderr)
	}
	wait := max(300*time.Millisecond, 3*time.Since(began)).Round(time.Millisecond)
	start := time.Now()
	r := cli(t, store, "run", "--wait", wait.String(), "job:held", "--", "touch", marker)
	if r.code != 75 {
		t.Fatalf("exit %d, want 75 (--wait %v; stderr %s)", r.code, wait, r.stderr)
	}
	if time.Since(start) < wait {
		t.Fatal("gave up before --wait ran out")
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the command ran although the key was held")
	}
	if !strings.Contains(r.stderr, "job:held") || !strings.Contains(r.stderr, "held") {
		t.Fatalf("stderr %q does not say the key is held", r.stderr)
	}
	// A wait that runs out before the store is even open: unavailable.
	if r := cli(t, store, "run", "--wait", "1ns", "job:held", "--", "touch", marker); r.code != 69 ||
		!strings.Contains(r.stderr, "ran out while opening the store") {
		t.Fatalf("--wait 1ns: exit %d, want 69 naming the open (stderr %s)", r.code, r.stderr)
	}
	// Waiting long enough gets the key once it is released.
	time.AfterFunc(300*time.Millisecond, func() { l.Release(ctx) })
	if r := cli(t, store, "run", "--wait", "20s", "job:held", "--", "touch", marker); r.code != 0 {
		t.Fatalf("waiting run: exit %d, stderr %s", r.code, r.stderr)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Fatal("the waiting run did not run its command")
	}
}

// waitHeld waits until key is held in store.
func waitHeld(t *testing.T, c *fenced.Client, key string) fenced.LeaseInfo {
	t.Helper()
	for i := 0; i < 400; i++ {
		if info, err := c.Inspect(context.Background(), key); err == nil && info.Held {
			return info
		}
		time.Sleep(25 * time.Millisecond)
	}
	t.Fatalf("%s never became held", key)
	return fenced.LeaseInfo{}
}

func TestRunLostLeaseStopsChild(t *testing.T) {
	store := tempStore(t)
	operator := client(t, store)
	for _, tc := range []struct {
		name, script, want, grace string
	}{
		// The shell's trap must run before SIGKILL: a loaded machine took
		// over 500ms to schedule it. It exits at once on a quiet one.
		{"child exits on SIGTERM", `trap 'echo got TERM; exit 0' TERM; echo started; sleep 30 & wait`, "got TERM", "10s"},
		{"child ignoring SIGTERM is killed after grace", `trap '' TERM; echo started; sleep 30`, "SIGKILL", "500ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "job:lost:" + strings.ReplaceAll(tc.name, " ", "-")
			cmd, out, errb := cliCmd(t, store, "run", "--ttl", "1s", "--grace", tc.grace, key, "--", "sh", "-c", tc.script)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer cmd.Process.Kill()
			info := waitHeld(t, operator, key)
			start := time.Now()
			if _, err := operator.Break(context.Background(), key, "test eviction", "cli test"); err != nil {
				t.Fatal(err)
			}
			err := cmd.Wait()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 77 {
				t.Fatalf("exit %v, want 77; stderr %s", err, errb.String())
			}
			if took := time.Since(start); took > 15*time.Second {
				t.Fatalf("took %v to stop the child after the break", took)
			}
			if all := out.String() + errb.String(); !strings.Contains(all, tc.want) || !strings.Contains(errb.String(), "lost") {
				t.Fatalf("want %q and a loss message; stdout %q stderr %q", tc.want, out.String(), errb.String())
			}
			if info.Fence == 0 {
				t.Fatal("no fence")
			}
		})
	}
}

func TestRunForwardsSignals(t *testing.T) {
	store := tempStore(t)
	cmd, out, errb := cliCmd(t, store, "run", "job:sig", "--", "sh", "-c", `trap 'echo got USR1; exit 5' USR1; echo ready; sleep 30 & wait`)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	waitHeld(t, client(t, store), "job:sig")
	time.Sleep(300 * time.Millisecond) // let the shell install its trap
	if err := cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 5 {
		t.Fatalf("exit %v, want the child's 5 after SIGUSR1; stdout %q stderr %q", err, out.String(), errb.String())
	}
	if !strings.Contains(out.String(), "got USR1") {
		t.Fatalf("child did not get SIGUSR1: %q", out.String())
	}
}

func TestAdminCommands(t *testing.T) {
	t.Parallel()
	store := tempStore(t)
	ctx := context.Background()
	c := client(t, store)
	var leases []*fenced.Lease
	for _, k := range []string{"inv:2", "inv:1", "other"} {
		l, err := c.TryAcquire(ctx, k, &fenced.LeaseOptions{TTL: 3 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	r := cli(t, store, "ls", "inv:", "-o", "json")
	if r.code != 0 {
		t.Fatalf("ls: %d %s", r.code, r.stderr)
	}
	var list []leaseJSON
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil {
		t.Fatalf("ls -o json: %v in %q", err, r.stdout)
	}
	if len(list) != 2 || list[0].Key != "inv:1" || list[1].Key != "inv:2" || !list[0].Held || list[0].Fence != 1 || list[0].RemainingMS <= 0 {
		t.Fatalf("ls inv: = %+v", list)
	}
	if strings.Contains(r.stdout, leases[1].Owner()) {
		t.Fatal("ls printed a whole owner token")
	}
	if r := cli(t, store, "ls"); r.code != 0 || !strings.Contains(r.stdout, "other") || !strings.Contains(r.stdout, "FENCE") {
		t.Fatalf("ls table: %d %q", r.code, r.stdout)
	}
	if r := cli(t, store, "break", "inv:1"); r.code != 64 || !strings.Contains(r.stderr, "--reason") {
		t.Fatalf("break without reason: %d %q", r.code, r.stderr)
	}
	if r := cli(t, store, "break", "inv:1", "--reason", "stuck worker", "--by", "ops"); r.code != 0 {
		t.Fatalf("break: %d %s", r.code, r.stderr)
	}
	select {
	case <-leases[1].Context().Done():
	case <-time.After(30 * time.Second):
		t.Fatal("holder not told of the break")
	}
	r = cli(t, store, "inspect", "inv:1", "-o", "json")
	var info leaseJSON
	if err := json.Unmarshal([]byte(r.stdout), &info); err != nil {
		t.Fatalf("inspect -o json: %v in %q", err, r.stdout)
	}
	if info.Held || info.Fence != 1 || len(info.Breaks) != 1 || info.Breaks[0].Reason != "stuck worker" || info.Breaks[0].By != "ops" {
		t.Fatalf("inspect after break = %+v", info)
	}
	if r := cli(t, store, "inspect", "inv:2"); r.code != 0 || !strings.Contains(r.stdout, "held") {
		t.Fatalf("inspect table: %d %q", r.code, r.stdout)
	}
	if r := cli(t, store, "inspect", "never"); r.code == 0 || !strings.Contains(r.stderr, "not found") {
		t.Fatalf("inspect of an unknown key: %d %q", r.code, r.stderr)
	}
	if r := cli(t, store, "ls", "-o", "yaml"); r.code != 64 {
		t.Fatalf("ls -o yaml: exit %d, want 64", r.code)
	}
	// The default store (SQLite) decides expiry by the host's wall clock,
	// wakes waiters by its doorbell (Subscribe) and has no queue.
	if r := cli(t, store, "guarantees"); r.code != 0 || !strings.Contains(r.stdout, "strict") || !strings.Contains(strings.Join(strings.Fields(r.stdout), " "), "safe from clock steps: false") {
		t.Fatalf("guarantees: %d %q", r.code, r.stdout)
	} else if out := strings.Join(strings.Fields(r.stdout), " "); !strings.Contains(out, "waiters notified: true") || !strings.Contains(out, "waiters served FIFO: false") {
		t.Fatalf("guarantees: waiters' notification and order: %q", r.stdout)
	}
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	store := tempStore(t)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--store", "nosuch://x", "ls"}, 64, "unknown scheme"},
		{[]string{"--store", "postgres://u:secret@127.0.0.1:1/db?connect_timeout=5", "ls"}, 69, "unavailable"},
		{[]string{"run", "", "--", "true"}, 64, "key is empty"},
		{[]string{"run", "k", "--ttl", "-1s", "--", "true"}, 64, "--ttl -1s"},
		{[]string{"run", "k", "--ttl", "0", "--", "true"}, 64, "TTL must be positive"},
		{[]string{"run", "k", "--ttl", "1ms", "--", "true"}, 64, "--ttl 1ms"},
		{[]string{"run", "k", "--ttl", "200h", "--", "true"}, 64, "--ttl 200h0m0s"},
		{[]string{"elect", "--ttl", "0", "svc", "--", "true"}, 64, "elect: --ttl 0s"},
		{[]string{"elect", "--ttl", "5ms", "svc", "--", "true"}, 64, "elect: --ttl 5ms"},
		{[]string{"partitions", "run", "g", "-p", "2", "--ttl", "-1s", "--", "true"}, 64, "partitions run: --ttl -1s"},
		{[]string{"partitions", "run", "g", "-p", "2", "--ttl", "5ms", "--", "true"}, 64, "partitions run: --ttl 5ms"},
		{[]string{"partitions", "run", "g", "--", "true"}, 64, "partitions run: no -p: give the number of partitions"},
		{[]string{"partitions", "ls", "nosuchgroup"}, 1, `group "nosuchgroup" has no live member and no partition lease`},
		{[]string{"partitions", "run", "g", "-p", "-3", "--", "true"}, 64, "partitions run: -p -3: want 1 to"},
		{[]string{"elect", "svc", "--ttl", "5ms", "--", "true"}, 64, "elect: --ttl 5ms"},
		{[]string{"elect", "svc", "--ttl", "5s", "true"}, 64, "flags after NAME need a -- before COMMAND"},
		{[]string{"run", "k", "--min-fence", "weak", "--", "true"}, 64, "--min-fence"},
		{[]string{"run", "k", "--max-hold", "-1s", "--", "true"}, 64, "--max-hold"},
		{[]string{"run", "k"}, 64, "KEY -- COMMAND"},
		{[]string{"nosuchcommand"}, 64, "unknown command"},
	} {
		r := cli(t, store, tc.args...)
		if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("fenced %q: exit %d stderr %q; want %d and %q", tc.args, r.code, r.stderr, tc.code, tc.want)
		}
		if strings.Contains(r.stderr, "secret") {
			t.Errorf("fenced %q printed a password: %q", tc.args, r.stderr)
		}
	}
}

func TestDemo(t *testing.T) {
	t.Parallel()
	r := cli(t, "", "demo")
	if r.code != 0 || !strings.Contains(r.stdout, "OK: exactly one invoice sent") || !strings.Contains(r.stdout, "REFUSED") {
		t.Fatalf("demo: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	r = cli(t, "", "demo", "--no-fence")
	if r.code != 0 || !strings.Contains(r.stdout, "HAZARD REPRODUCED") {
		t.Fatalf("demo --no-fence: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
}
