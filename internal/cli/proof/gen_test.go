package proof

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// genSeed returns FENCED_PROOF_SEED if set, else a seed from the clock.
func genSeed(t *testing.T) uint64 {
	if s := os.Getenv("FENCED_PROOF_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("FENCED_PROOF_SEED=%q: %v", s, err)
		}
		return n
	}
	return uint64(time.Now().UnixNano())
}

// envDuration returns the duration in env var name, or def.
func envDuration(t *testing.T, name string, def time.Duration) time.Duration {
	if s := os.Getenv(name); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("%s=%q: %v", name, s, err)
		}
		return d
	}
	return def
}

// minOps is the fewest operations a generative run of the tests must
// invoke: thousands, not hundreds.
const minOps = 1000

// runGen runs one generative run on backend b and fails t, naming the
// seed, if the checker finds a violation.
func runGen(t *testing.T, b backend, cfg GenConfig) GenReport {
	t.Helper()
	e := b.start(t, false)
	cfg.Store, cfg.Server, cfg.MinFence = e.store, e.server, b.minFence
	cfg.Command, cfg.Logf = testCommand, t.Logf
	if cfg.MinOps == 0 {
		cfg.MinOps = minOps
	}
	cfg.Dir = historyDir(t, fmt.Sprintf("gen-%s-%d", b.name, cfg.Seed))
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Duration+5*time.Minute)
	defer cancel()
	started := time.Now()
	res, err := RunGen(ctx, cfg)
	if err != nil {
		t.Fatalf("%s seed %d: %v (history in %s)", b.name, cfg.Seed, err, cfg.Dir)
	}
	rep := res.Report
	t.Logf("%s seed %d (%v, CPU share %.2f): %d ops %v, %d grants (at most %d held by one worker), %d faults, %d errors; fence regressions %d, repeats %d, live past validity %d (max %v), orphans %d/%d slow/%d seen, sets healthy with a lost member %d, outlived a break %d, renewed after a break %d, overlaps %d",
		b.name, rep.Seed, time.Since(started).Round(time.Second), rep.CPUShare, rep.Ops, rep.ByOp, rep.Grants, rep.MaxHeld, rep.Faults, rep.Errors, rep.FenceRegressions, rep.FenceRepeats, rep.LivePastValidity, rep.MaxOvershoot, rep.Orphans, rep.SlowOrphans, rep.OrphansSeen, rep.SetsHealthyWithLost, rep.OutlivedBreak, rep.RenewedAfterBreak, rep.Overlaps)
	if rep.Failed() {
		t.Errorf("%s: the generative proof failed with seed %d (rerun: FENCED_PROOF_SEED=%d), first violation %v into the run; history in %s:\n%s", b.name, rep.Seed, rep.Seed, rep.FirstViolation.Round(time.Second), cfg.Dir, strings.Join(rep.Problems, "\n"))
	}
	if out := os.Getenv("FENCED_PROOF_OUT"); out != "" {
		build := os.Getenv("FENCED_PROOF_BUILD")
		if build == "" {
			build = "main"
		}
		mode := "slice"
		if os.Getenv("FENCED_PROOF_LONG") != "" {
			mode = "long"
		}
		rows := filepath.Join(out, "proof", "generative.json")
		row := GenRow{Build: build, Backend: b.name, Mode: mode, Duration: time.Since(started).Round(time.Second), Report: rep, Date: time.Now().UTC().Format("2006-01-02")}
		if err := SaveGenRow(rows, row); err != nil {
			t.Error(err)
		} else if err := UpdateGenSection(filepath.Join(out, "proof.md"), rows); err != nil {
			t.Error(err)
		}
	}
	// The Redis row covers the driver's pipeline: calls that overlap on
	// one client share round trips, and the checks above judged them too.
	if b.name == "redis" {
		t.Logf("redis: %d scripts went through the workers' pipelines", rep.Piped)
		if rep.Piped == 0 {
			t.Errorf("redis seed %d: no script went through a worker's pipeline: the row did not run it", rep.Seed)
		}
	}
	// Thousands of operations on a machine of its own: minOps scaled by
	// the share of a CPU the run got (a busy machine runs fewer a second),
	// after the run went on past its Duration for them (GenConfig.MinOps,
	// up to 3 × Duration). Fewer even then is a workload that stalls.
	if need := MinOpsAt(minOps, rep.CPUShare); rep.Ops < need {
		elapsed := time.Since(started)
		t.Errorf("%s seed %d: only %d operations in %v (%.1f a second), want %d (%d at the CPU share of %.2f the run measured; it went on past %v up to %v for them); the slice must run thousands", b.name, rep.Seed, rep.Ops, elapsed.Round(time.Second), float64(rep.Ops)/elapsed.Seconds(), need, minOps, rep.CPUShare, cfg.Duration, 3*cfg.Duration)
	}
	return rep
}

// genBackends are the backends of the generative CI slice.
var genBackends = []string{"sqlite", "postgres", "redis", "etcd"}

// TestGenerativeSlice is the CI slice of the generative proof: on SQLite,
// PostgreSQL, Redis and etcd, 3 workers × 4 streams of random operations
// for 40s (FENCED_PROOF_GEN_DURATION), with faults drawn from the seed
// (FENCED_PROOF_SEED; printed on failure).
func TestGenerativeSlice(t *testing.T) {
	if testing.Short() {
		t.Skip("the generative proof starts servers and worker processes")
	}
	parallelRow(t)
	seed := genSeed(t)
	d := envDuration(t, "FENCED_PROOF_GEN_DURATION", 40*time.Second)
	only := os.Getenv("FENCED_PROOF_BACKENDS")
	for _, b := range backends() {
		if !containsName(genBackends, b.name) || (only != "" && !containsName(strings.Split(only, ","), b.name)) {
			continue
		}
		t.Run(b.name, func(t *testing.T) {
			runGen(t, b, GenConfig{Seed: seed, Duration: d})
		})
	}
}

// TestGenerativeLong is the nightly-scale generative run (scripts/proof.sh
// --long): every backend of the slice, FENCED_PROOF_LONG long each (for
// example 1h), with up to 10 000 pool leases per worker.
func TestGenerativeLong(t *testing.T) {
	long := os.Getenv("FENCED_PROOF_LONG")
	if long == "" {
		t.Skip("set FENCED_PROOF_LONG (scripts/proof.sh --long) to run the long generative proof")
	}
	d := envDuration(t, "FENCED_PROOF_LONG", 0)
	seed := genSeed(t)
	only := os.Getenv("FENCED_PROOF_BACKENDS")
	for _, b := range backends() {
		if !containsName(genBackends, b.name) || (only != "" && !containsName(strings.Split(only, ","), b.name)) {
			continue
		}
		t.Run(b.name, func(t *testing.T) {
			runGen(t, b, GenConfig{Seed: seed, Duration: d, Keys: 30000, MaxHeld: 10000, PoolTTL: 10 * time.Second, Streams: 8})
		})
	}
}

func containsName(names []string, n string) bool {
	for _, m := range names {
		if m == n {
			return true
		}
	}
	return false
}
