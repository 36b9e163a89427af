package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// proofGenChecks are the rows of the generative report's checks.
var proofGenChecks = []string{
	"fence regressions", "overlapping holders", "leases live past their local validity",
	"orphan grants (no Acquire returned them) held past their TTL", "orphans or waiters' grants left standing with no fault active",
	"sets reported healthy with a lost member", "leases live on after a break", "leases renewed after a break",
}

// checkProofGenPassed checks a passing generative report: exit 0, the
// seed, operations counted, at least one fault, every check row ok, PASS,
// the rerun command and a history written.
func checkProofGenPassed(t *testing.T, r result, seed string) {
	t.Helper()
	if r.code != 0 {
		t.Fatalf("exit %d, want 0\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	if !strings.Contains(r.stdout, "\nseed:        "+seed+"\n") {
		t.Errorf("the report does not name seed %s:\n%s", seed, r.stdout)
	}
	m := regexp.MustCompile(`(?m)^operations:  (\d+) \((.*)\)$`).FindStringSubmatch(r.stdout)
	if m == nil {
		t.Fatalf("no operations line:\n%s", r.stdout)
	}
	if n, _ := strconv.Atoi(m[1]); n == 0 || !strings.Contains(m[2], "hold ") || !strings.Contains(m[2], "acquire ") {
		t.Errorf("operations line %q: want operations counted by kind", m[0])
	}
	// The first gap between faults is at most 8 TTLs (8s), shorter than the
	// 10s run, so the nemesis injects at least one whatever the seed.
	if f := regexp.MustCompile(`(?m)^faults:      (\d+) injected \(M[14] `).FindStringSubmatch(r.stdout); f == nil || f[1] == "0" {
		t.Errorf("no fault injected, or the faults line is not there:\n%s", r.stdout)
	}
	for _, c := range proofGenChecks {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(c) + `.*\s0\b.*\sok$`).MatchString(r.stdout) {
			t.Errorf("check %q is not listed as 0 and ok:\n%s", c, r.stdout)
		}
	}
	if !strings.Contains(r.stdout, "\nPASS: ") || strings.Contains(r.stdout, "VIOLATED") {
		t.Errorf("no PASS verdict:\n%s", r.stdout)
	}
	if !strings.Contains(r.stdout, "\nrerun:       fenced proof --generative --seed "+seed+" --duration 10s") {
		t.Errorf("no rerun line with seed %s:\n%s", seed, r.stdout)
	}
	h := regexp.MustCompile(`(?m)^histories:   (.+)$`).FindStringSubmatch(r.stdout)
	if h == nil {
		t.Fatalf("no histories line:\n%s", r.stdout)
	}
	if st, err := os.Stat(filepath.Join(h[1], "history.jsonl")); err != nil || st.Size() == 0 {
		t.Errorf("no history in %s: %v", h[1], err)
	}
}

// TestProofGenerativeSQLite runs fenced proof --generative for 10s on a
// SQLite file: it passes, M4 is off (no link to cut) and so are M5 and M6
// (proof did not start the store).
//
// The runs of these tests do not run in parallel: each starts its own worker
// processes, and side by side on a 2-core machine they starve one another
// (the checker then finds lease contexts that ended more than 100ms past
// their validity, a real finding that no test should manufacture).
func TestProofGenerativeSQLite(t *testing.T) {
	if testing.Short() {
		t.Skip("long: a 10s generative proof; run without -short")
	}
	r := cli(t, tempStore(t), "proof", "--generative", "--seed", "7", "--duration", "10s", "--dir", t.TempDir())
	checkProofGenPassed(t, r, "7")
	for _, off := range []string{"M4 off: cut a worker off", "M5 off: pause the store", "M6 off: kill and restart the store"} {
		if !strings.Contains(r.stdout, off) {
			t.Errorf("the report does not say %q:\n%s", off, r.stdout)
		}
	}
}

// TestProofGenerativeRedis runs fenced proof --generative for 10s on a
// durable Redis, with no --seed: the seed is drawn and printed first, and
// the report names it. The strict default fence is refused first, naming
// --min-fence=repeatable. M4 (through a proxy) is on, M5 and M6 off.
func TestProofGenerativeRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("long: a 10s generative proof on Redis; run without -short")
	}
	store := testenv.StartRedis(t, testenv.RedisConfig{}).URL()
	if r := cli(t, store, "proof", "--generative", "--duration", "10s"); r.code != exitUsage || !strings.Contains(r.stderr, "--min-fence=repeatable") {
		t.Fatalf("generative proof on Redis with a strict fence: exit %d, stderr %s; want %d naming --min-fence=repeatable", r.code, r.stderr, exitUsage)
	}
	r := cli(t, store, "proof", "--generative", "--min-fence", "repeatable", "--duration", "10s", "--dir", t.TempDir())
	m := regexp.MustCompile(`^fenced: generative proof for 10s with seed (\d+),`).FindStringSubmatch(r.stderr)
	if m == nil {
		t.Fatalf("stderr does not begin with the drawn seed: %q", r.stderr)
	}
	checkProofGenPassed(t, r, m[1])
	if !strings.Contains(r.stdout, "--min-fence repeatable (same store)") {
		t.Errorf("the rerun line does not carry --min-fence:\n%s", r.stdout)
	}
	if strings.Contains(r.stdout, "M4 off") || !strings.Contains(r.stdout, "M5 off: pause the store") || !strings.Contains(r.stdout, "M6 off: kill and restart the store") {
		t.Errorf("on Redis M4 is on, M5 and M6 off; the report says:\n%s", r.stdout)
	}
}

// TestProofGenerativeReportsAViolation runs fenced proof --generative on
// SQLite while, as soon as the run's keys appear, a fenced run of another
// user takes a lease on a contended key under the run's prefix and holds
// it: a grant that no worker was handed, held past the longest TTL the
// workers ask for (5s) plus 1s. The checker must report it, the report
// must say FAIL and name the key, and fenced must exit 1.
func TestProofGenerativeReportsAViolation(t *testing.T) {
	if testing.Short() {
		t.Skip("long: a 10s generative proof that must catch a foreign hold; run without -short")
	}
	store := tempStore(t)
	// The foreign hold must be planted, and seen held past the run's TTL,
	// while the run still lists its keys. The test plants it with a few
	// CLI runs, each a process that opens the store: on a busy machine
	// they take seconds, so the run lasts ten of them (10s at least).
	began := time.Now()
	if r := cli(t, store, "ls", proofGenPrefix, "-o", "json"); r.code != 0 {
		t.Fatalf("ls: exit %d, stderr %s", r.code, r.stderr)
	}
	duration := max(10*time.Second, 10*time.Since(began)).Round(time.Second)
	cmd, out, errb := cliCmd(t, store, "proof", "--generative", "--seed", "11", "--duration", duration.String(), "--workers", "2",
		"--dir", t.TempDir())
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var prefix string
	run := regexp.MustCompile(`^(` + regexp.QuoteMeta(proofGenPrefix) + `11:\d+:)`)
	eventually(t, 2*duration, "the run's keys did not appear", func() bool {
		var held []struct {
			Key string `json:"key"`
		}
		if r := cli(t, store, "ls", proofGenPrefix, "-o", "json"); r.code != 0 || json.Unmarshal([]byte(r.stdout), &held) != nil {
			return false
		}
		for _, h := range held {
			if m := run.FindStringSubmatch(h.Key); m != nil {
				prefix = m[1]
				return true
			}
		}
		return false
	})
	foreign, _, _ := startRun(t, store, "run", "--ttl", "30s", prefix+"h:foreign", "--", "sleep", "60")
	defer func() { _ = foreign.Process.Kill(); _ = foreign.Wait() }()
	<-done
	r := result{cmd.ProcessState.ExitCode(), out.String(), errb.String()}
	if r.code != exitError {
		t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, exitError, r.stdout, r.stderr)
	}
	if !regexp.MustCompile(`(?m)^orphan grants \(no Acquire returned them\) held past their TTL\s+[1-9]\d* .*VIOLATED$`).MatchString(r.stdout) {
		t.Errorf("the orphan check is not VIOLATED:\n%s", r.stdout)
	}
	if !strings.Contains(r.stdout, "\nviolations (the first 20):\n") || !strings.Contains(r.stdout, prefix+"h:foreign: a grant no Acquire returned") {
		t.Errorf("the violation on %sh:foreign is not listed:\n%s", prefix, r.stdout)
	}
	if !strings.Contains(r.stdout, "\nFAIL: the checker found violations") ||
		!strings.Contains(r.stdout, "\nrerun:       fenced proof --generative --seed 11 --duration "+duration.String()+" --workers 2") {
		t.Errorf("no FAIL verdict or rerun line:\n%s", r.stdout)
	}
}

// TestProofGenerativeRejectsBadFlags checks that flags that do not go
// together are refused at once with exit 64 and a message naming them.
func TestProofGenerativeRejectsBadFlags(t *testing.T) {
	t.Parallel()
	store := tempStore(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--generative", "--quick"}, "--quick runs the fixed scenarios, --generative"},
		{[]string{"--generative", "--duration", "-1s"}, "--duration must be positive, not -1s"},
		{[]string{"--generative", "--duration", "0"}, "--duration must be positive, not 0s"},
		{[]string{"--generative", "--duration", "500ms"}, "--duration 500ms is shorter than --ttl 1s"},
		{[]string{"--generative", "--ttl", "0"}, "--ttl must be positive, not 0s"},
		{[]string{"--generative", "--workers", "0"}, "--workers must be at least 1, not 0"},
		{[]string{"--generative", "--seed", "-1"}, `invalid argument "-1" for "--seed"`},
		{[]string{"--seed", "3"}, "--seed needs --generative"},
		{[]string{"--quick", "--duration", "5s"}, "--duration needs --generative"},
		{[]string{"--generative", "--store", "mem://x"}, "a mem:// store lives inside one process"},
	} {
		start := time.Now()
		r := cli(t, store, append([]string{"proof"}, tc.args...)...)
		if r.code != exitUsage || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("proof %v: exit %d, stderr %q; want %d and %q", tc.args, r.code, r.stderr, exitUsage, tc.want)
		}
		if strings.Contains(r.stderr, "generative proof for") || time.Since(start) > 20*time.Second {
			t.Errorf("proof %v started a run (stderr %q, %v)", tc.args, r.stderr, time.Since(start))
		}
	}
}
