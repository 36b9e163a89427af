package main

import (
	"context"
	"errors"
	"net/url"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/drivertest"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// backendCase is a store the CLI is checked against, started for real.
type backendCase struct {
	name  string
	start func(t *testing.T) string // returns the store URL
	// flags the store needs for `run` (for example to accept its fence).
	runFlags []string
	opts     fenced.LeaseOptions
}

var backendCases = []backendCase{
	{name: "sqlite", start: tempStore},
	{
		name:     "redis",
		start:    func(t *testing.T) string { return testenv.StartRedis(t, testenv.RedisConfig{Password: "s3cret"}).URL() },
		runFlags: []string{"--min-fence=repeatable"},
		opts:     fenced.LeaseOptions{MinFence: fenced.FenceRepeatable},
	},
	{
		name: "redlock",
		start: func(t *testing.T) string {
			var hosts []string
			for i := 0; i < 3; i++ {
				hosts = append(hosts, testenv.StartRedis(t, testenv.RedisConfig{Password: "s3cret"}).Addr())
			}
			return "redlock://:s3cret@" + strings.Join(hosts, ",") + "/0"
		},
		runFlags: []string{"--min-fence=none"},
		opts:     fenced.LeaseOptions{MinFence: fenced.FenceNone},
	},
	{name: "postgres", start: func(t *testing.T) string { return testenv.StartPostgres(t).URL() }},
	{name: "mysql", start: func(t *testing.T) string { return testenv.StartMySQL(t).URL() }},
	{name: "etcd", start: func(t *testing.T) string { return testenv.StartEtcd(t).URL("") }},
	{name: "zookeeper", start: func(t *testing.T) string { return testenv.StartZooKeeper(t).URL("/fenced-cli", "") }},
	{name: "dynamodb", start: func(t *testing.T) string {
		return testenv.StartDynalite(t, testenv.DynaliteConfig{}).URL("leases", "create=1")
	}},
}

// TestRunWaitAndBreakOnDynamoDB checks the rest of the CLI contract on the
// store without a server clock: a waiting run gets the key with a higher
// fence once the holder's run is broken, and the broken run exits 77.
func TestRunWaitAndBreakOnDynamoDB(t *testing.T) {
	t.Parallel()
	store := testenv.StartDynalite(t, testenv.DynaliteConfig{}).URL("leases", "create=1")
	admin := client(t, store)
	key := "cli:dynamo"
	holder, hout, herr := cliCmd(t, store, "run", "--ttl", "2s", "--grace", "500ms", key, "--", "sh", "-c", `echo "held $FENCED_FENCE"; sleep 30 & wait`)
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer holder.Process.Kill()
	info := waitHeld(t, admin, key)
	waiter, wout, werr := cliCmd(t, store, "run", "--ttl", "2s", "--wait", "30s", key, "--", "sh", "-c", `echo "got $FENCED_FENCE"`)
	if err := waiter.Start(); err != nil {
		t.Fatal(err)
	}
	defer waiter.Process.Kill()
	time.Sleep(3 * time.Second) // the holder renews: the waiter keeps waiting
	if now, err := admin.Inspect(context.Background(), key); err != nil || !now.Held || now.Fence != info.Fence {
		t.Fatalf("while the holder renewed: %+v, %v; want still held with fence %d", now, err, info.Fence)
	}
	if r := cli(t, store, "break", key, "--reason", "cli test"); r.code != 0 {
		t.Fatalf("break: %d %s", r.code, r.stderr)
	}
	err := holder.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 77 {
		t.Fatalf("broken holder: exit %v, want 77; stdout %q stderr %q", err, hout.String(), herr.String())
	}
	if err := waiter.Wait(); err != nil {
		t.Fatalf("waiter: %v; stderr %q", err, werr.String())
	}
	got, err := strconv.ParseUint(strings.TrimPrefix(strings.TrimSpace(wout.String()), "got "), 10, 64)
	if err != nil || got <= info.Fence {
		t.Fatalf("waiter ran with %q, want a fence above the broken holder's %d", wout.String(), info.Fence)
	}
}

// TestCommandsOnEveryBackend runs run, ls, inspect and break against every
// backend linked into the CLI.
func TestCommandsOnEveryBackend(t *testing.T) {
	for _, bc := range backendCases {
		t.Run(bc.name, func(t *testing.T) {
			t.Parallel() // mostly waiting for servers to start
			store := bc.start(t)
			ctx := context.Background()
			// The run's lease must outlive a stall of the CLI process:
			// 5s, or eight of the store's slowest grants now.
			ttl := drivertest.StoreTTL(t, store, 1, 5*time.Second)
			run := func(key string, extra ...string) result {
				args := append([]string{"run", "--ttl", ttl.String()}, bc.runFlags...)
				args = append(args, extra...)
				args = append(args, key, "--", "sh", "-c", `echo "$FENCED_KEY=$FENCED_FENCE"`)
				return cli(t, store, args...)
			}
			if len(bc.runFlags) > 0 {
				r := cli(t, store, "run", "cli:job", "--", "true")
				if r.code != 64 || !strings.Contains(r.stderr, bc.runFlags[0]) {
					t.Fatalf("run without %s: exit %d, stderr %q; want 64 naming the flag", bc.runFlags[0], r.code, r.stderr)
				}
			}
			r := run("cli:job")
			if r.code != 0 {
				t.Fatalf("run: exit %d, stderr %s", r.code, r.stderr)
			}
			fenceOf := func(r result) uint64 {
				t.Helper()
				f, err := strconv.ParseUint(strings.TrimPrefix(strings.TrimSpace(r.stdout), "cli:job="), 10, 64)
				if err != nil {
					t.Fatalf("child output %q: want cli:job=FENCE", r.stdout)
				}
				return f
			}
			first, second := fenceOf(r), fenceOf(run("cli:job"))
			if bc.opts.MinFence == fenced.FenceNone {
				if first != 0 || second != 0 {
					t.Fatalf("fences %d, %d from a store without a fence; want 0", first, second)
				}
			} else if first == 0 || second <= first {
				t.Fatalf("fences %d then %d; want non-zero and strictly increasing", first, second)
			}
			c := client(t, store)
			opts := bc.opts
			opts.TTL = 10 * time.Second
			l, err := c.TryAcquire(ctx, "cli:held", &opts)
			if err != nil {
				t.Fatal(err)
			}
			if r := run("cli:held"); r.code != 75 || r.stdout != "" {
				t.Fatalf("run on a held key: exit %d, stdout %q; want 75 and nothing run", r.code, r.stdout)
			}
			if r := cli(t, store, "ls", "cli:", "-o", "json"); r.code != 0 || !strings.Contains(r.stdout, `"cli:held"`) {
				t.Fatalf("ls: %d %q %s", r.code, r.stdout, r.stderr)
			}
			if r := cli(t, store, "inspect", "cli:held"); r.code != 0 || !strings.Contains(r.stdout, strconv.FormatUint(l.Fence(), 10)) {
				t.Fatalf("inspect: %d %q %s", r.code, r.stdout, r.stderr)
			}
			if r := cli(t, store, "break", "cli:held", "--reason", "cli test"); r.code != 0 {
				t.Fatalf("break: %d %s", r.code, r.stderr)
			}
			if r := run("cli:held"); r.code != 0 {
				t.Fatalf("run after break: exit %d, stderr %s", r.code, r.stderr)
			}
			if strings.Contains(r.stderr, "s3cret") {
				t.Fatal("a password reached stderr")
			}
			// Issue 16 item 16: COMMAND sees the store without its password.
			args := append(append([]string{"run"}, bc.runFlags...), "cli:env", "--", "sh", "-c", `echo "$FENCED_STORE"`)
			r = cli(t, store, args...)
			if r.code != 0 || !strings.Contains(r.stdout, "://") {
				t.Fatalf("run: exit %d, stdout %q, stderr %s", r.code, r.stdout, r.stderr)
			}
			u, err := url.Parse(store)
			if err != nil {
				t.Fatal(err)
			}
			if pw, ok := u.User.Password(); ok && pw != "" && strings.Contains(r.stdout, pw) || strings.Contains(r.stdout, "s3cret") {
				t.Fatalf("COMMAND got the store's password in FENCED_STORE=%q", r.stdout)
			}
		})
	}
}
