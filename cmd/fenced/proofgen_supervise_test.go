package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/internal/cli/proof"
)

// supAttacks are the attacks each supervisor is drawn with (see
// TestRunUnderAttack and TestPartitionsRunUnderAttack).
var supAttacks = map[string][]string{
	"run":        {"loss", "ctrl-z", "sigstop", "kill-9"},
	"elect":      {"loss", "ctrl-z", "sigstop", "kill-9"},
	"partitions": {"loss", "sigstop", "kill-9", "kill-9-supervisor", "sigstop-supervisor"},
}

// scenarioBag deals scenarios drawn from a seed: the supervisors come
// from a shuffled bag of the three, and each supervisor's attacks from a
// shuffled bag of its own, refilled when empty, so that a short run still
// covers every supervisor and spreads the attacks.
type scenarioBag struct {
	rng      *rand.Rand
	commands []string
	attacks  map[string][]string
}

// deal draws one scenario: a supervisor, an attack, a mode (by name, see
// runModes), a TTL of 2 or 3 s, a --grace below it (partitions run
// refuses one that is not; 1 s or more under a SIGSTOP) and a delay
// within a TTL, so that the attack lands anywhere in the renewal cycle.
func (b *scenarioBag) deal() (attackScenario, string) {
	if len(b.commands) == 0 {
		b.commands = []string{"run", "elect", "partitions"}
		b.rng.Shuffle(len(b.commands), func(i, j int) { b.commands[i], b.commands[j] = b.commands[j], b.commands[i] })
	}
	sc := attackScenario{command: b.commands[0]}
	b.commands = b.commands[1:]
	if len(b.attacks[sc.command]) == 0 {
		a := append([]string(nil), supAttacks[sc.command]...)
		b.rng.Shuffle(len(a), func(i, j int) { a[i], a[j] = a[j], a[i] })
		b.attacks[sc.command] = a
	}
	sc.attack = b.attacks[sc.command][0]
	b.attacks[sc.command] = b.attacks[sc.command][1:]
	mode := runModes[b.rng.IntN(len(runModes))].name
	sc.ttl = time.Duration(2+b.rng.IntN(2)) * time.Second
	sc.grace = 100*time.Millisecond + time.Duration(b.rng.Int64N(int64(sc.ttl-110*time.Millisecond)))
	if sc.attack == "sigstop" || sc.attack == "sigstop-supervisor" {
		// At least 1 s: the check that a continued supervisor ends the
		// tree at once, not after --grace, cannot tell a shorter grace
		// from a round of signals (see runAttack).
		sc.grace = time.Second + time.Duration(b.rng.Int64N(int64(sc.ttl-time.Second-10*time.Millisecond)))
	}
	sc.delay = time.Duration(b.rng.Int64N(int64(sc.ttl)))
	return sc, mode
}

// The supervisors' row of the generative proof: scenarios drawn from a
// seed (FENCED_PROOF_SEED reruns a draw; FENCED_PROOF_SUP_SCENARIOS sets
// how many, 10 by default), each one CLI supervisor in one supervision
// mode under one attack, with the attacker set every supervisor shares,
// checked for what docs/supervision.md promises in that mode (see
// runAttack and partitionsAttack). With FENCED_PROOF_OUT=DIR the row is
// kept in DIR/proof/generative-supervision.json and DIR/proof.md's
// section is rewritten (FENCED_PROOF_BUILD names a build other than main).
func TestGenerativeSupervision(t *testing.T) {
	if testing.Short() {
		t.Skip("long: supervisors under drawn attacks; run without -short")
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("FENCED_PROOF_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("FENCED_PROOF_SEED=%q: %v", s, err)
		}
	}
	n := 10
	if s := os.Getenv("FENCED_PROOF_SUP_SCENARIOS"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil || n < 1 {
			t.Fatalf("FENCED_PROOF_SUP_SCENARIOS=%q: want a positive number", s)
		}
	}
	t.Logf("seed %d (FENCED_PROOF_SEED=%d draws these scenarios again), %d scenarios", seed, seed, n)
	bag := &scenarioBag{rng: rand.New(rand.NewPCG(seed, seed>>1)), attacks: map[string][]string{}}
	bin := attackerBin(t)
	rep := proof.GenSupReport{Seed: seed, ByCommand: map[string]int{}, ByAttack: map[string]int{}, ByMode: map[string]int{}}
	start := time.Now()
	for i := range n {
		sc, mode := bag.deal()
		name := fmt.Sprintf("%02d-%s-%s-ttl%v-grace%v-delay%v", i, sc.command, sc.attack, sc.ttl,
			sc.grace.Round(time.Millisecond), sc.delay.Round(time.Millisecond))
		var res attackResult
		ok := t.Run(name, func(t *testing.T) {
			inMode(t, func(t *testing.T, want string) {
				sc.mode = want
				if sc.command == "partitions" {
					res = partitionsAttack(t, bin, sc)
				} else {
					res = runAttack(t, bin, sc)
				}
			}, mode)
		})
		rep.ByCommand[sc.command]++
		rep.ByAttack[sc.attack]++
		rep.ByMode[mode]++
		rep.Attempts += res.attempts
		rep.Late += res.late
		rep.Excused += res.excused
		if !ok {
			rep.Failed++
			if rep.Failed == 1 {
				rep.FirstViolation = time.Since(start)
				rep.FirstFailure = name + "/" + mode
				rep.FailureLine = res.violation
				if rep.FailureLine == "" {
					rep.FailureLine = "the scenario stopped on a fatal error (see the test log)"
				}
			}
		}
	}
	rep.Duration = time.Since(start)
	t.Logf("seed %d, %v: scenarios by command %v, by attack %v, by mode %v; %d old-fence attempts, %d after the newer grant (%d excused by their row); %d failed",
		seed, rep.Duration.Round(time.Second), rep.ByCommand, rep.ByAttack, rep.ByMode, rep.Attempts, rep.Late, rep.Excused, rep.Failed)
	if rep.Failed > 0 {
		t.Errorf("the supervisors' row failed with seed %d (rerun: FENCED_PROOF_SEED=%d), first %v into the run (%s): %s",
			seed, seed, rep.FirstViolation.Round(time.Millisecond), rep.FirstFailure, rep.FailureLine)
	}
	if out := os.Getenv("FENCED_PROOF_OUT"); out != "" {
		build := os.Getenv("FENCED_PROOF_BUILD")
		if build == "" {
			build = "main"
		}
		rows := filepath.Join(out, "proof", "generative-supervision.json")
		row := proof.GenSupRow{Build: build, Backend: "redis", Mode: "slice", Report: rep, Date: time.Now().UTC().Format("2006-01-02")}
		if err := proof.SaveGenSupRow(rows, row); err != nil {
			t.Error(err)
		} else if err := proof.UpdateGenSupSection(filepath.Join(out, "proof.md"), rows); err != nil {
			t.Error(err)
		}
	}
}
