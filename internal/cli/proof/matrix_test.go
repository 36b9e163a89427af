package proof

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// notApplicable says why fault f does not apply to backend b (the name of
// a backend of backends, with its env e), or "" if it does.
func notApplicable(b string, e env, f Fault) string {
	if only := topologyFaults[b]; only != nil {
		if !slices.Contains(only, f) {
			return "skip" // a topology built for other faults; not a row
		}
		return ""
	}
	switch {
	case f == CrashLeader:
		return "skip" // the etcd (3 members) row
	case f.NeedsServer() && e.server == nil:
		return "the SQLite authority is a file the workers open, not a server"
	case (f == CutHolder || f == PauseMidAcquire) && b == "sqlite":
		return "no network between the workers and the SQLite authority"
	case f == FailoverReplica && b == "redis":
		return "runs on its own topology: the redis (primary + replica) row"
	case f == FailoverReplica:
		return "asynchronous primary/replica failover is Redis's declared hazard (FenceRepeatable); " + notFailover[b]
	case f == StepNodeClock && b == "redlock":
		return "runs on five nodes: the redlock (5 nodes) row"
	case f == StepNodeClock:
		return "a clock jump on one Redlock node of five (M12 is a step of the authority's clock)"
	case f == PartitionPastSession && b != "zookeeper":
		return "ZooKeeper session loss; M4 cuts a holder off on this backend"
	case f == StepAuthorityClock && e.clock == nil:
		return notClockStep[b]
	}
	return ""
}

// notFailover says why M7's failover has no counterpart on a backend.
var notFailover = map[string]string{
	"sqlite":    "SQLite is one file, with no replica",
	"postgres":  "the matrix runs one PostgreSQL server; a promoted asynchronous standby is outside its declared guarantee",
	"mysql":     "the matrix runs one MariaDB server; a promoted asynchronous replica is outside its declared guarantee",
	"redlock":   "Redlock's nodes are independent primaries with no replicas (M8 faults one node)",
	"etcd":      "etcd acknowledges a write once a quorum has it (M10 kills the leader)",
	"zookeeper": "ZooKeeper acknowledges a write once a quorum has it",
	"dynamodb":  "dynalite is one process; DynamoDB's own replication is not reachable from here",
}

// notClockStep says why M12 does not apply to a backend.
var notClockStep = map[string]string{
	"sqlite":    "the SQLite authority is a file: its clock is the workers' own host clock",
	"redlock":   "M8 steps one node's clock (a step on every node is M12 on Redis, times three)",
	"etcd":      "etcd's leases expire by the leader's monotonic clock (Capabilities.ClockStepSafe)",
	"zookeeper": "ZooKeeper sessions expire by the servers' monotonic clock (Capabilities.ClockStepSafe)",
	"dynamodb":  "fenced's DynamoDB backend reads only monotonic clocks (Capabilities.ClockStepSafe)",
}

// matrixFaults are the faults of the full matrix, in the report's order.
var matrixFaults = []Fault{PauseHolder, DelayWrite, KillHolder, CutHolder, PauseAuthority, CrashAuthority, FailoverReplica, StepNodeClock, PauseMidAcquire, CrashLeader, PartitionPastSession, StepAuthorityClock, ReorderWrites}

// TestMatrixFull runs the whole matrix and writes the report; it runs only
// when FENCED_PROOF_OUT names the docs directory (scripts/proof.sh sets
// it). FENCED_PROOF_BACKENDS limits the backends, FENCED_PROOF_FAULTS the
// faults (comma-separated). Every claim-first row is checked as in
// TestMatrixCI (checkScenario).
func TestMatrixFull(t *testing.T) {
	out := os.Getenv("FENCED_PROOF_OUT")
	if out == "" {
		t.Skip("set FENCED_PROOF_OUT (scripts/proof.sh) to run the full matrix")
	}
	only := os.Getenv("FENCED_PROOF_BACKENDS")
	injections := 2
	type sc struct {
		f        Fault
		fencing  bool
		ordering Ordering
	}
	var scenarios []sc
	for _, f := range matrixFaults {
		if faults := os.Getenv("FENCED_PROOF_FAULTS"); faults != "" && !strings.Contains(","+faults+",", ","+string(f)+",") {
			continue
		}
		scenarios = append(scenarios, sc{f, true, ClaimFirst}, sc{f, false, ClaimFirst})
	}
	if len(scenarios) > 0 && scenarios[len(scenarios)-1].f == ReorderWrites {
		scenarios = append(scenarios, sc{ReorderWrites, true, WriteOnly})
	}
	var rows []Row
	svgs := map[Fault][]Event{}
	var tables bytes.Buffer
	started := time.Now()
	for _, b := range backends() {
		if only != "" && !strings.Contains(","+only+",", ","+b.name+",") {
			continue
		}
		t.Run(b.name, func(t *testing.T) {
			e := b.start(t, true)
			for _, s := range scenarios {
				row := Row{Backend: b.name, Fault: s.f, Fencing: s.fencing, Ordering: s.ordering}
				if row.NA = notApplicable(b.name, e, s.f); row.NA == "skip" {
					continue
				} else if row.NA != "" {
					rows = append(rows, row)
					continue
				}
				cfg := e.config()
				cfg.Fault, cfg.Fencing, cfg.Ordering, cfg.MinFence, cfg.TTL, cfg.Injections = s.f, s.fencing, s.ordering, b.minFence, time.Second, injections
				cfg.Keys = []string{fmt.Sprintf("fenced-proof:full:%s:%s:%v:%s:%d", b.name, s.f, s.fencing, s.ordering, time.Now().UnixNano())}
				cfg.Command, cfg.Dir, cfg.Logf = testCommand, t.TempDir(), t.Logf
				res, err := Run(t.Context(), cfg)
				if err != nil {
					t.Errorf("%s %s fencing=%v: %v", b.name, s.f, s.fencing, err)
					row.NA = "run failed: " + strings.ReplaceAll(err.Error(), "|", "/")
					rows = append(rows, row)
					continue
				}
				rep := res.Report
				row.Report = &rep
				rows = append(rows, row)
				if s.ordering == ClaimFirst {
					checkScenario(t, b.name, s.f, s.fencing, rep)
				}
				t.Logf("%s %s fencing=%v %s: %+v", b.name, s.f, s.fencing, s.ordering, rep)
				if s.fencing && s.ordering == ClaimFirst && svgs[s.f] == nil {
					svgs[s.f] = res.Events
				}
			}
		})
	}
	WriteMarkdownTable(&tables, rows)
	if err := os.MkdirAll(filepath.Join(out, "proof"), 0o755); err != nil {
		t.Fatal(err)
	}
	var md bytes.Buffer
	fmt.Fprintf(&md, "<!-- generated by scripts/proof.sh; do not edit -->\n# Proof matrix\n\nRun %s with `./scripts/proof.sh`", time.Now().UTC().Format("2006-01-02"))
	if only != "" {
		fmt.Fprintf(&md, " (FENCED_PROOF_BACKENDS=%s)", only)
	}
	fmt.Fprintf(&md, " on a 2-core Debian machine; 3 worker processes, 1 s leases, %d injections per row; took %v.\n\n", injections, time.Since(started).Round(time.Second))
	md.WriteString(matrixPreamble)
	md.Write(tables.Bytes())
	if err := writePacketRows(&md, filepath.Join(out, "proof", "netns.json")); err != nil {
		t.Fatal(err)
	}
	if err := writeIncumbents(&md, filepath.Join(out, "proof")); err != nil {
		t.Fatal(err)
	}
	genRows, err := ReadGenRows(filepath.Join(out, "proof", "generative.json"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	md.WriteString("\n")
	WriteGenSection(&md, genRows)
	partRows, err := ReadGenPartRows(filepath.Join(out, "proof", "generative-partitions.json"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	md.WriteString("\n")
	WriteGenPartSection(&md, partRows)
	if err := WritePartitions(&md, filepath.Join(out, "proof")); err != nil {
		t.Fatal(err)
	}
	md.WriteString("\n## Timelines\n\nOne run per fault, fencing on, drawn from its recorded history.\n\n")
	for _, f := range matrixFaults {
		evs := svgs[f]
		if evs == nil {
			continue
		}
		var svg bytes.Buffer
		WriteTimelineSVG(&svg, fmt.Sprintf("%s, fencing on", f), evs)
		name := fmt.Sprintf("proof/%s.svg", f)
		if err := os.WriteFile(filepath.Join(out, name), svg.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&md, "### %s\n\n![%s timeline](%s)\n\n", f, f, name)
	}
	if err := os.WriteFile(filepath.Join(out, "proof.md"), md.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// writeIncumbents writes the incumbents' section from the rows the bench
// modules' TestProofIncumbents left in dir (incumbents-*.json); a file not
// there is named as not run.
func writeIncumbents(md *bytes.Buffer, dir string) error {
	md.WriteString("\n## The incumbents, side by side\n\n")
	md.WriteString(incumbentsPreamble)
	var rows []Row
	for _, f := range []struct{ file, libs string }{
		{"incumbents-redis.json", "redsync, redislock (bench/redis)"},
		{"incumbents-consensus.json", "etcd concurrency.Mutex, go-zookeeper Lock (bench/consensus)"},
	} {
		r, err := ReadRows(filepath.Join(dir, f.file))
		switch {
		case errors.Is(err, os.ErrNotExist):
			fmt.Fprintf(md, "- %s: not run yet (run scripts/proof.sh)\n", f.libs)
			continue
		case err != nil:
			return err
		}
		rows = append(rows, r...)
	}
	if len(rows) > 0 {
		md.WriteString("\n")
		WriteMarkdownTable(md, rows)
	}
	return nil
}

const incumbentsPreamble = `The same workload and checker drive the locks teams use today, each writing
to the resource without a fence (they give none): redsync's Mutex and
bsm/redislock on one Redis, etcd's concurrency.Mutex (session TTL = lease TTL)
and go-zookeeper's Lock. The checker gives each grant the fence an ideal lock
would have issued (1, 2, ... per key in the order the grants were confirmed)
and judges the run by it: a write accepted after a later-granted holder's write
is a stale write accepted. Fault ids as above; fencing is off by nature.
`

const matrixPreamble = `Each row is one scenario: W worker processes loop acquire → read (claim-first:
claim and read in one transaction) → work → lease check → guarded append to a
scratch SQLite ledger plus one "invoice" per entry → release, while the nemesis
injects the fault (see package proof for how each fault is produced). Columns:
stale writes *attempted* were sent (or, delayed, landed) after a newer grant was
confirmed; *accepted* counts writes the resource accepted after it had accepted a
higher fence. Fence regressions count a lower fence (or an equal one, where the
backend's fence is strict) granted after a grant confirmed earlier; repeats are
equal fences on a backend that declares them (Redis), where a lower fence
that reissues one granted before (a failover rolled the counter back) is
the declared repeat, not a regression. Overlaps are pairs of
workers that both believed they held the key. Porcupine checks the ledger
against a fenced append log (see proof/linearize.go). Recovery is the longest
time from a fault to the next grant. Fencing off: the resource ignores fences,
so the hazards must show, or the checker would not be believed. M13 with the
write-only ordering is the seed's documented limit: a stale write that reaches
the resource before the new holder's first write is accepted, and the new
holder then builds on state read before it; claim-first closes it.

M7, M8, M11 and M12 hold a holder before its write while its lease is taken
away behind its back, and let it write once another worker has: M7 fails a
Redis primary over to a replica cut off before the grant (the promoted
replica repeats the fence: "repeats" counts the pairs of grants that share
one; the guard's owner rule refuses the second owner's claim), M8 steps one
of five Redlock nodes' clocks forward by 10 TTLs, M11 partitions the holder
from ZooKeeper past its session timeout, M12 steps the authority's wall
clock forward by 10 TTLs (the backends declare ClockStepSafe false: the
lease ends early and two holders overlap; the fence refuses the older).
Where the authority keeps the grant (M8: four nodes of five still hold it),
the holder is let go after 8 TTLs, and recovery (measured from the fault to
the next grant) includes that wait.

`
