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

// genPartBackends are the backends of the partitions row of the
// generative proof, each run as a subtest of its own beside the others.
var genPartBackends = []string{"sqlite", "redis", "postgres", "etcd"}

// TestGenerativePartitions is the partitions row of the generative proof
// (RunGenPartitions, CheckGenPartitions): 4 member processes of one group
// under kill -9, SIGSTOP past the TTL, leave, and deploys of another
// partition count while a member of the old one is stopped, for 40s
// (FENCED_PROOF_PART_DURATION) per backend, with the schedule drawn from
// FENCED_PROOF_SEED (printed on failure).
func TestGenerativePartitions(t *testing.T) {
	if testing.Short() {
		t.Skip("the generative proof starts servers and member processes")
	}
	parallelRow(t)
	seed := genSeed(t)
	d := envDuration(t, "FENCED_PROOF_PART_DURATION", 40*time.Second)
	only := os.Getenv("FENCED_PROOF_BACKENDS")
	for _, b := range backends() {
		if !containsName(genPartBackends, b.name) || (only != "" && !containsName(strings.Split(only, ","), b.name)) {
			continue
		}
		t.Run(b.name, func(t *testing.T) {
			parallelRow(t)
			// A run in which too little happened (a machine too slow for
			// the row's duration) runs again, twice as long, with the
			// same seed; its checks are the same.
			cfg := GenPartConfig{Seed: seed, Duration: d, TTL: time.Second}
			for round := 1; ; round++ {
				rep, late := runGenPart(t, b, cfg, round == 3)
				if late {
					// Its time bounds assume a renewal lands within a
					// third of the TTL; the run saw a longer delay.
					next := (max(2*cfg.TTL, 3*rep.MaxSchedDelay) + 99*time.Millisecond).Truncate(100 * time.Millisecond)
					t.Logf("%s seed %d, run %d: missed only time bounds, after a scheduling delay of %v, over a third of "+
						"the TTL %v (%s); again with TTL %v", b.name, seed, round, rep.MaxSchedDelay.Round(time.Millisecond),
						cfg.TTL, strings.Join(rep.Problems, "; "), next)
					cfg.TTL = next
					continue
				}
				little := tooLittle(rep)
				switch {
				case t.Failed():
					if little != "" {
						t.Logf("%s seed %d: also %s", b.name, seed, little)
					}
					return
				case little == "":
					return
				case round == 3:
					t.Errorf("%s seed %d, in 3 runs, the last of %v: %s", b.name, seed, cfg.Duration, little)
					return
				}
				t.Logf("%s seed %d, run %d of %v: %s; again for %v", b.name, seed, round, cfg.Duration, little, 2*cfg.Duration)
				cfg.Duration *= 2
			}
		})
	}
}

// runGenPart runs one partitions run on backend b and fails t, naming
// the seed, if the checker finds a violation. Unless last, a run that
// missed only time bounds after a scheduling delay over a third of its
// TTL does not fail t: it reports late, to be run again.
func runGenPart(t *testing.T, b backend, cfg GenPartConfig, last bool) (rep GenPartReport, late bool) {
	t.Helper()
	e := b.start(t, false)
	cfg.Store, cfg.MinFence = e.store, b.minFence
	cfg.Command, cfg.Logf = testCommand, t.Logf
	// A rerun changes the duration or the TTL: a directory of its own.
	cfg.Dir = historyDir(t, fmt.Sprintf("genpart-%s-%d-%v-%v", b.name, cfg.Seed, cfg.Duration, cfg.TTL))
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Duration+3*time.Minute)
	defer cancel()
	rep, err := RunGenPartitions(ctx, cfg)
	if err != nil {
		t.Fatalf("%s seed %d: %v (history in %s)", b.name, cfg.Seed, err, cfg.Dir)
	}
	t.Logf("%s seed %d (%v): faults %v, member exits by code %v; %d ownerships at counts %v, writes %d accepted / %d refused; overlaps %d, stale accepted %d, late item writes %d; checkpoints %d accepted / %d refused, %d ownerships started from one, stale checkpoints accepted %d, breaks of continuity %d; longest unowned %v (bound %v, %d spells, %d listings, scheduling delay %v); %s: balanced by weight %v after the churn (bound %v)",
		b.name, rep.Seed, rep.Duration, rep.Faults, rep.Exits, rep.Ownerships, rep.Counts, rep.WritesAccepted, rep.WritesRefused,
		rep.Overlaps, rep.StaleAccepted, rep.LateItemWrites, rep.CheckpointsAccepted, rep.CheckpointsRefused, rep.CheckpointStarts,
		rep.StaleCheckpoints, rep.CheckpointBreaks,
		rep.LongestUnowned.Round(time.Millisecond), rep.Bound.Round(time.Millisecond), rep.Spells, rep.Listings, rep.MaxSchedDelay.Round(time.Millisecond),
		rep.Knobs, rep.Converge.Round(time.Millisecond), rep.ConvergeBound.Round(time.Millisecond))
	late = !last && rep.Failed() && rep.Missed == len(rep.Problems) && rep.MaxSchedDelay > cfg.TTL/3
	if rep.Failed() && !late {
		t.Errorf("%s: the partitions proof failed with seed %d (rerun: FENCED_PROOF_SEED=%d), first violation %v into the run; history in %s:\n%s",
			b.name, rep.Seed, rep.Seed, rep.FirstViolation.Round(time.Millisecond), cfg.Dir, strings.Join(rep.Problems, "\n"))
	}
	if rep.LateItemWrites > 0 {
		t.Logf("%s seed %d: %d late item writes (reported, not failed; see docs/proof.md), the first: %s", b.name, rep.Seed, rep.LateItemWrites, rep.FirstLateItemWrite)
	}
	if out := os.Getenv("FENCED_PROOF_OUT"); out != "" {
		build := os.Getenv("FENCED_PROOF_BUILD")
		if build == "" {
			build = "main"
		}
		mode := "slice"
		if os.Getenv("FENCED_PROOF_PART_DURATION") != "" {
			mode = "long"
		}
		rows := filepath.Join(out, "proof", "generative-partitions.json")
		row := GenPartRow{Build: build, Backend: b.name, Mode: mode, Report: rep, Date: time.Now().UTC().Format("2006-01-02")}
		if err := SaveGenPartRow(rows, row); err != nil {
			t.Error(err)
		} else if err := UpdateGenPartSection(filepath.Join(out, "proof.md"), rows); err != nil {
			t.Error(err)
		}
	}
	for code, n := range rep.Exits {
		if code != exitPartitionCount && code != exitMemberLive {
			t.Errorf("%s seed %d: %d member(s) exited by themselves with code %d (logs in %s)", b.name, rep.Seed, n, code, cfg.Dir)
		}
	}
	return rep, late
}

// tooLittle says what rep's run did too little of for its zeros to mean
// something, or returns "".
func tooLittle(rep GenPartReport) string {
	var out []string
	// A deploy of another count, and work under each (hundreds of writes
	// even on a starved machine; thousands on an idle one).
	if rep.Faults["deploy"] == 0 || rep.WritesAccepted < 300 || len(rep.Counts) < 2 {
		out = append(out, fmt.Sprintf("too little happened (faults %v, %d writes, counts %v): the row must deploy new counts and write hundreds of times",
			rep.Faults, rep.WritesAccepted, rep.Counts))
	}
	// Every backend of the row keeps checkpoints: new owners must have
	// started from them, and a member stopped past its TTL must have
	// tried a stale one when it resumed.
	if rep.CheckpointsAccepted < 50 || rep.CheckpointStarts == 0 || rep.Faults["stop"] > 0 && rep.CheckpointsRefused == 0 {
		out = append(out, fmt.Sprintf("too few checkpoints (%d accepted, %d refused after %d stops, %d ownerships started from one): "+
			"the row must carry checkpoints across owners and refuse a stopped member's",
			rep.CheckpointsAccepted, rep.CheckpointsRefused, rep.Faults["stop"], rep.CheckpointStarts))
	}
	return strings.Join(out, "; ")
}
