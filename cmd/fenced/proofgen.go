package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/cli/proof"
	"github.com/fenced-dev/fenced/internal/core/storeurl"
)

// proofGenPrefix starts the keys of every generative run of fenced proof
// (under proofPrefix, so the check that no foreign lease is held there
// covers them); the run adds its seed and start time.
const proofGenPrefix = proofPrefix + "gen:"

// proofGenDefaultDuration is --duration's default.
const proofGenDefaultDuration = time.Minute

// proofFaultOff is a fault of the generative nemesis left out of a run,
// and why.
type proofFaultOff struct {
	Fault string `json:"fault"`
	Why   string `json:"why"`
}

// proofGenJSON is the report of `fenced proof --generative -o json`.
type proofGenJSON struct {
	Store    string `json:"store"`
	Seed     uint64 `json:"seed"`
	Duration string `json:"duration"`
	Elapsed  string `json:"elapsed"`
	Workers  int    `json:"workers"`
	Streams  int    `json:"streams"`
	TTL      string `json:"ttl"`
	// FaultsInjected counts the faults injected by report id (M1, M4).
	FaultsInjected map[string]int  `json:"faults_injected"`
	FaultsOff      []proofFaultOff `json:"faults_off"`
	Report         proof.GenReport `json:"report"`
	Pass           bool            `json:"pass"`
	Verdict        string          `json:"verdict"`
	Rerun          string          `json:"rerun"`
	Histories      string          `json:"histories"`
}

// checkProofGenFlags rejects flags that do not go together with or
// without --generative; changed reports whether a flag was given.
func checkProofGenFlags(f *proofFlags, changed func(string) bool) error {
	if !f.generative {
		for _, name := range []string{"seed", "duration"} {
			if changed(name) {
				return withCode(exitUsage, fmt.Errorf("proof: --%s needs --generative", name))
			}
		}
		return nil
	}
	switch {
	case f.quick:
		return withCode(exitUsage,
			fmt.Errorf("proof: --quick runs the fixed scenarios, --generative runs random operations for --duration: choose one"))
	case f.duration <= 0:
		return withCode(exitUsage, fmt.Errorf("proof: --duration must be positive, not %v", f.duration))
	case f.ttl <= 0:
		return withCode(exitUsage, fmt.Errorf("proof: --ttl must be positive, not %v", f.ttl))
	case f.duration < f.ttl:
		return withCode(exitUsage,
			fmt.Errorf("proof: --duration %v is shorter than --ttl %v: the nemesis waits half a TTL or more before each fault", f.duration,
				f.ttl))
	case f.workers < 1:
		return withCode(exitUsage, fmt.Errorf("proof: --workers must be at least 1, not %d", f.workers))
	}
	return nil
}

// proofGenFaults returns the faults the generative nemesis injects against
// store and those it leaves out, with why. fenced proof never started the
// store, so it can neither pause it (M5) nor crash and restart it (M6).
func proofGenFaults(store string) ([]proof.Fault, []proofFaultOff) {
	on := []proof.Fault{proof.PauseHolder}
	off := []proofFaultOff{
		{proof.PauseAuthority.ID(), "pause the store: fenced proof did not start it, so it cannot stop it"},
		{proof.CrashAuthority.ID(), "kill and restart the store: fenced proof did not start it, so it cannot restart it"},
	}
	if strings.HasPrefix(store, "sqlite:") {
		off = append([]proofFaultOff{{proof.CutHolder.ID(), "cut a worker off: a SQLite store is a local file, with no link to cut"}},
			off...)
	} else {
		on = append(on, proof.CutHolder)
	}
	return on, off
}

// runProofGen runs the generative proof against the store with worker
// processes running self, writing the history under dir, and prints the
// report; a violation exits with exitError.
func runProofGen(ctx context.Context, g *globals, f *proofFlags, strength fenced.FenceStrength, self string) error {
	if strings.HasPrefix(g.store, "mem:") {
		return withCode(exitUsage,
			fmt.Errorf("proof: a mem:// store lives inside one process, and the workers are processes: give a store they share"))
	}
	faults, off := proofGenFaults(g.store)
	dir, err := os.MkdirTemp(f.dir, fmt.Sprintf("generative-seed%d-", f.seed))
	if err != nil {
		return err
	}
	logf := func(string, ...any) {}
	if g.verbose {
		logf = func(format string, args ...any) { fmt.Fprintf(g.stderr, "fenced: "+format+"\n", args...) }
	}
	// The seed first, so that a run cut short can be rerun.
	fmt.Fprintf(g.stderr, "fenced: generative proof for %v with seed %d, histories in %s\n", f.duration, f.seed, dir)
	cfg := proof.GenConfig{
		Store: g.store, MinFence: strength, Seed: f.seed, Workers: f.workers, TTL: f.ttl, Duration: f.duration,
		Faults: faults, Command: func() *exec.Cmd { return exec.Command(self) },
		Dir: dir, Prefix: proofGenPrefix, Logf: logf,
	}
	started := time.Now()
	res, err := proof.RunGen(ctx, cfg)
	if err != nil {
		return fmt.Errorf("proof: seed %d (history in %s): %w", f.seed, dir, err)
	}
	rep := res.Report
	injected := map[string]int{}
	for _, e := range res.Events {
		if e.Kind == proof.FaultStart {
			injected[e.Fault]++
		}
	}
	verdict, pass := proofGenVerdict(rep)
	out := proofGenJSON{
		Store: storeurl.Redact(g.store), Seed: f.seed, Duration: f.duration.String(),
		Elapsed: time.Since(started).Round(time.Millisecond).String(),
		Workers: res.Config.Workers, Streams: res.Config.Streams, TTL: res.Config.TTL.String(),
		FaultsInjected: injected, FaultsOff: off, Report: rep, Pass: pass, Verdict: verdict,
		Rerun: proofGenRerun(f), Histories: dir,
	}
	if err := printProofGen(g, out); err != nil {
		return err
	}
	if !pass {
		return withCode(exitError, nil)
	}
	return nil
}

// proofGenVerdict says whether the run kept every promise the checker
// checks, and ran operations at all (a run with no grant proves nothing).
func proofGenVerdict(rep proof.GenReport) (string, bool) {
	switch {
	case rep.Failed():
		first := ""
		if rep.FirstViolation > 0 {
			first = fmt.Sprintf(", the first %v into the run", rep.FirstViolation.Round(time.Millisecond))
		}
		return fmt.Sprintf("FAIL: the checker found violations%s (listed above)", first), false
	case rep.Ops == 0 || rep.Grants == 0:
		return fmt.Sprintf("FAIL: the workers invoked %d operations and were granted %d leases: the run proves nothing", rep.Ops,
			rep.Grants), false
	}
	return "PASS: no fence went backwards, no lease lived past its validity or a break, no two holders overlapped, " +
		"no orphan grant outstayed its TTL, no set reported a lost member healthy.", true
}

// proofGenRerun returns the command that reruns f's run: the same
// operations and faults, with their timing the machine's.
func proofGenRerun(f *proofFlags) string {
	s := fmt.Sprintf("fenced proof --generative --seed %d --duration %v", f.seed, f.duration)
	if f.workers != 3 {
		s += fmt.Sprintf(" --workers %d", f.workers)
	}
	if f.ttl != time.Second {
		s += fmt.Sprintf(" --ttl %v", f.ttl)
	}
	if f.minFence != "" {
		s += " --min-fence " + f.minFence
	}
	return s + " (same store)"
}

// printProofGen prints the generative report as JSON or as text.
func printProofGen(g *globals, out proofGenJSON) error {
	if g.output == "json" {
		enc := json.NewEncoder(g.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	rep := out.Report
	w := g.stdout
	fmt.Fprintf(w, "store:       %s\n", out.Store)
	fmt.Fprintf(w, "seed:        %d\n", out.Seed)
	fmt.Fprintf(w, "duration:    %s (ran %s; CPU share %.2f)\n", out.Duration, out.Elapsed, rep.CPUShare)
	fmt.Fprintf(w, "workers:     %d processes × %d streams, TTL %s\n", out.Workers, out.Streams, out.TTL)
	fmt.Fprintf(w, "operations:  %d (%s)\n", rep.Ops, countsByName(rep.ByOp))
	fmt.Fprintf(w, "grants:      %d; most leases held by one worker %d; failed acquisitions %d (refusals included)\n", rep.Grants,
		rep.MaxHeld, rep.Errors)
	fmt.Fprintf(w, "faults:      %d injected (%s)\n", rep.Faults, proofFaultCounts(out.FaultsInjected))
	for _, o := range out.FaultsOff {
		fmt.Fprintf(w, "             %s off: %s\n", o.Fault, o.Why)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tFOUND\tRESULT")
	row := func(check string, n int, note string) {
		result := "ok"
		if n > 0 {
			result = "VIOLATED"
		}
		fmt.Fprintf(tw, "%s\t%d%s\t%s\n", check, n, note, result)
	}
	row("fence regressions (a lower fence, or with a strict fence an equal one to another owner)", rep.FenceRegressions, "")
	row("overlapping holders (a key granted while another owner's lease lived on)", rep.Overlaps, "")
	row("leases live past their local validity", rep.LivePastValidity, fmt.Sprintf(" (largest overshoot %v)", rep.MaxOvershoot))
	row("orphan grants (no Acquire returned them) held past their TTL", rep.Orphans, fmt.Sprintf(" (of %d seen)", rep.OrphansSeen))
	row("orphans or waiters' grants left standing with no fault active", rep.SlowOrphans, "")
	row("sets reported healthy with a lost member", rep.SetsHealthyWithLost, "")
	row("leases live on after a break", rep.OutlivedBreak, "")
	row("leases renewed after a break", rep.RenewedAfterBreak, "")
	fmt.Fprintf(tw, "fence repeats (the store declares its fence repeatable)\t%d\tallowed\n", rep.FenceRepeats)
	tw.Flush()
	if len(rep.Problems) > 0 {
		fmt.Fprintln(w, "\nviolations (the first 20):")
		for _, p := range rep.Problems {
			fmt.Fprintf(w, "  %s\n", p)
		}
	}
	fmt.Fprintf(w, "\n%s\nrerun:       %s\nhistories:   %s\n", out.Verdict, out.Rerun, out.Histories)
	return nil
}

// countsByName formats counts as "a 1, b 2", sorted by name.
func countsByName(m map[string]int) string {
	var parts []string
	for k, n := range m {
		parts = append(parts, fmt.Sprintf("%s %d", k, n))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// proofFaultCounts formats injected faults as "M1 pause a worker 3, …".
func proofFaultCounts(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	names := map[string]string{proof.PauseHolder.ID(): "SIGSTOP a worker", proof.CutHolder.ID(): "cut a worker off"}
	var parts []string
	for k, n := range m {
		name := names[k]
		if name == "" {
			name = proof.Fault(k).Name()
		}
		parts = append(parts, fmt.Sprintf("%s %s %d", k, name, n))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}
