package proof

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// genElectBackends are the backends of the elector row of the generative
// proof: Redis (each elector behind its own proxy, so links can be cut)
// and SQLite (no link to cut).
var genElectBackends = []string{"redis", "sqlite"}

// TestGenerativeElector is the elector row of the generative proof
// (RunGenElect, CheckGenElect): 3 processes running client-go's
// leaderelection.RunOrDie over fencedk8s under cut links, SIGSTOP past
// the LeaseDuration, kill -9 and Client.Break, for 30s
// (FENCED_PROOF_ELECT_DURATION) per backend, with the schedule drawn from
// FENCED_PROOF_SEED (printed on failure). FENCED_PROOF_ELECT_HAZARD=1
// makes the leaders work under client-go's context alone (the hazard the
// checker must find).
func TestGenerativeElector(t *testing.T) {
	if testing.Short() {
		t.Skip("the generative proof starts servers and elector processes")
	}
	seed := genSeed(t)
	d := envDuration(t, "FENCED_PROOF_ELECT_DURATION", 30*time.Second)
	hazard := os.Getenv("FENCED_PROOF_ELECT_HAZARD") != ""
	only := os.Getenv("FENCED_PROOF_BACKENDS")
	for _, b := range backends() {
		if !containsName(genElectBackends, b.name) || (only != "" && !containsName(strings.Split(only, ","), b.name)) {
			continue
		}
		t.Run(b.name, func(t *testing.T) {
			runGenElect(t, b, GenElectConfig{Seed: seed, Duration: d, IgnoreLeaderContext: hazard})
		})
	}
}

// runGenElect runs one elector run on backend b and fails t, naming the
// seed, if the checker finds a violation.
func runGenElect(t *testing.T, b backend, cfg GenElectConfig) GenElectReport {
	t.Helper()
	e := b.start(t, false)
	cfg.Store, cfg.MinFence = e.store, b.minFence
	cfg.Command, cfg.Logf = testCommand, t.Logf
	cfg.Dir = t.TempDir()
	if keep := os.Getenv("PROOF_KEEP"); keep != "" {
		cfg.Dir = filepath.Join(keep, fmt.Sprintf("genelect-%s-%d", b.name, cfg.Seed))
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Duration+3*time.Minute)
	defer cancel()
	rep, err := RunGenElect(ctx, cfg)
	if err != nil {
		t.Fatalf("%s seed %d: %v (history in %s)", b.name, cfg.Seed, err, cfg.Dir)
	}
	t.Logf("%s seed %d (%v, hazard switch %t): faults %v (on the leader %v), %d terms (%d without a lease), writes %d accepted / %d refused; overlaps %d (after a break %d, max %v), client-go overlaps %d strict / %d after a stop or break (max %v, max %v after the resume), stale accepted %d; longest recovery %v after a %s (bound %v, scheduling delay %v, %d recoveries)",
		b.name, rep.Seed, rep.Duration, cfg.IgnoreLeaderContext, rep.Faults, rep.Hurt, rep.Terms, rep.NoLease, rep.WritesAccepted, rep.WritesRefused,
		rep.Overlaps, rep.BreakOverlaps, rep.MaxBreakOverlap.Round(time.Millisecond), rep.CGOverlaps, rep.CGPauseOverlaps, rep.MaxCGPauseOverlap.Round(time.Millisecond), rep.MaxCGAfterResume.Round(time.Millisecond),
		rep.StaleAccepted, rep.LongestRecovery.Round(time.Millisecond), rep.RecoveryKind, rep.Bound.Round(time.Millisecond), rep.MaxSchedDelay.Round(time.Millisecond), rep.Recoveries)
	if rep.Failed() {
		t.Errorf("%s: the elector proof failed with seed %d (rerun: FENCED_PROOF_SEED=%d), first violation %v into the run; history in %s:\n%s",
			b.name, rep.Seed, rep.Seed, rep.FirstViolation.Round(time.Millisecond), cfg.Dir, strings.Join(rep.Problems, "\n"))
	}
	if out := os.Getenv("FENCED_PROOF_OUT"); out != "" {
		build := os.Getenv("FENCED_PROOF_BUILD")
		switch {
		case build != "":
		case cfg.IgnoreLeaderContext:
			build = "hazard: leaders under client-go's context alone"
		default:
			build = "main"
		}
		rows := filepath.Join(out, "proof", "generative-elector.json")
		row := GenElectRow{Build: build, Backend: b.name, Report: rep, Date: time.Now().UTC().Format("2006-01-02")}
		if err := SaveGenElectRow(rows, row); err != nil {
			t.Error(err)
		} else if err := UpdateGenElectSection(filepath.Join(out, "proof.md"), rows); err != nil {
			t.Error(err)
		}
	}
	// What the row must have exercised for its zeros to mean something:
	// faults on the leader, several terms, and writes under them.
	if rep.Recoveries < 3 || rep.Terms < 3 || rep.WritesAccepted < 100 {
		t.Errorf("%s seed %d: too little happened (faults %v, on the leader %v, %d terms, %d writes)", b.name, rep.Seed, rep.Faults, rep.Hurt, rep.Terms, rep.WritesAccepted)
	}
	return rep
}
