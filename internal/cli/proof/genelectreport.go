package proof

import (
	"fmt"
	"io"
	"time"
)

// GenElectRow is one elector run (RunGenElect) as the report shows it.
type GenElectRow struct {
	// Build names the code that ran: "main", or the hazard switched on.
	Build   string         `json:"build"`
	Backend string         `json:"backend"`
	Report  GenElectReport `json:"report"`
	Date    string         `json:"date"`
}

// Markers around the elector row's section of docs/proof.md; the section
// goes before genElectBefore when the report has none yet.
const (
	genElectBegin  = "<!-- generative-elector: begin -->"
	genElectEnd    = "<!-- generative-elector: end -->"
	genElectBefore = "## Partitioned ownership (recipe.Partitions)"
)

func (r GenElectRow) key() rowKey { return rowKey{build: r.Build, backend: r.Backend} }

// SaveGenElectRow adds row to the rows kept in path (a JSON array),
// replacing the row of the same build and backend; main's rows first.
func SaveGenElectRow(path string, row GenElectRow) error { return saveRow(path, row) }

const genElectPreamble = `The elector row of the generative proof (proof.RunGenElect; ` +
	"`go test ./internal/electproof -run TestGenerativeElector`" + ` in
fencedk8s/, its own module, with ` + "`GOWORK=$PWD/../.ci/go.work`" + `; in the normal suite, 30 s of faults per backend; ` +
	"`FENCED_PROOF_ELECT_DURATION`" + ` for longer runs, ` +
	"`FENCED_PROOF_SEED`" + ` to rerun one):
3 processes run client-go's ` + "`leaderelection.RunOrDie`" + ` over a fencedk8s.ResourceLock, as users run it (LeaseDuration 3 s,
RenewDeadline 2 s, RetryPeriod 0.5 s, ReleaseOnCancel), on Redis each through its own proxy. A leader works under
` + "`lock.LeaderContext(ctx)`" + `: every 20 ms it writes a SQLite resource guarded by fence.SQL with the term's fence (and once
more after the context ended, so that the resource must refuse), and every 10 ms it samples its work context and
client-go's, noting CLOCK_MONOTONIC before and after the check. A nemesis drawn from the seed, one fault at a time,
three in four on the leader: *cut* (the proxy stops forwarding, 1.2-2 LeaseDurations), *stop* (SIGSTOP as long),
*kill* (-9, started again within a LeaseDuration) or *break* (Client.Break of the election's lease); after a fault on
the leader it waits for the next term. Checks, ordered by the store's fence: *overlaps*: no term's work context seen
live (a check begun at T) after a later term's was (a check ended at T′ < T), no tolerance, except a broken lease's
until its TTL after the break (Client.Break's promise; counted apart); *client-go overlaps*: the same for
client-go's own contexts, strict except after a stop or a break of the earlier leader, where client-go ends its
term only after RenewDeadline of failed renewals (the documented gap: measured, with how long the paused leader's
context lived on after it was continued, and it must end); *stale accepted*: the accepted fences never go down;
*recovery*: after each fault on the leader the next term's work context is live within the store's keep of the
grant + client-go's campaign period (RetryPeriod × 2.2, its jitter) + 2 samples + 3 × the scheduling delay
measured in the run (after a break, the break's duration instead of the keep; on SQLite plus the stop: a process
stopped inside a write of the store's file holds its lock). Rows other than main ran with the leaders working
under client-go's context alone (the hazard switch, ` + "`FENCED_PROOF_ELECT_HAZARD=1`" + `); "first violation" is how far
into the run the checker found two leaders.

Found by this row: Lease.Err said nil while another goroutine was ending the lease (it had marked it ended and
not yet cancelled its context). After a SIGSTOP past the lease, the resumed leader's expiry and its own look at
LeaderContext ran at the same instant, and it read LeaderContext live 2.7 s after the next leader's term began
(Redis, seed 1796483709750853554, four CPU hogs alongside, 31.1 s in; the seed replays the schedule, not the race).
Fixed in lease.go (Err waits for that end to finish); regression test TestErrWhileTheLeaseIsBeingEnded, which holds
the window open. The window is microseconds wide: the row hit it once in 5 Redis runs before the fix, and not in 3
more runs with the fix reverted (four CPU hogs alongside each).
With the hazard switch the row fails at the first stop of the leader: the resumed leader works on under
client-go's context for up to RetryPeriod + RenewDeadline after the resume while the next leader works (seed
1796483529650605069 on Redis 3.4 s and 3.7 s in, two runs; seed 1796484148465472194 on Redis 9.2 s in and on SQLite
24.4 s in); the fence guard still refuses every write of the old term once the new one has written (*stale
accepted* 0, hundreds refused). With the fix, 3 more slice runs on both backends, each with four CPU
hogs alongside, passed: seeds 1796483964525212423 (on Redis 4 cuts, 3 of the leader), 1796484073480928320 (4 stops
on each backend) and 1796484250805699410.

`

// WriteGenElectSection writes the elector row's section (between its
// markers).
func WriteGenElectSection(w io.Writer, rows []GenElectRow) {
	fmt.Fprintf(w, "%s\n## client-go's elector over fencedk8s in the generative proof\n\n%s", genElectBegin, genElectPreamble)
	fmt.Fprintln(w,
		"| build | backend | seed | seconds | faults cut / stop / kill / break (on the leader) "+
			"| terms | writes accepted / refused | overlaps (after a break, max) | client-go overlaps strict / after a stop or break "+
			"(max; max after the resume) | stale accepted | longest recovery (bound) | first violation |")
	fmt.Fprintln(w, "|---|---|---|---:|---|---:|---|---|---|---:|---|---|")
	for _, r := range rows {
		rep := r.Report
		first := "none"
		if rep.Failed() {
			first = fmt.Sprintf("%v in", rep.FirstViolation.Round(100*time.Millisecond))
		}
		f := func(k string) string { return fmt.Sprintf("%d (%d)", rep.Faults[k], rep.Hurt[k]) }
		fmt.Fprintf(w,
			"| %s | %s | %d | %.0f | %s / %s / %s / %s | %d | %d / %d | %d (%d, %v) | %d / %d (%v; %v) | %d | %v after a %s (%v) | %s |\n",
			r.Build, r.Backend, rep.Seed, rep.Duration.Seconds(), f("cut"), f("stop"), f("kill"), f("break"), rep.Terms,
			rep.WritesAccepted, rep.WritesRefused, rep.Overlaps, rep.BreakOverlaps, rep.MaxBreakOverlap.Round(time.Millisecond),
			rep.CGOverlaps, rep.CGPauseOverlaps, rep.MaxCGPauseOverlap.Round(time.Millisecond),
			rep.MaxCGAfterResume.Round(time.Millisecond),
			rep.StaleAccepted, rep.LongestRecovery.Round(time.Millisecond), rep.RecoveryKind, rep.Bound.Round(time.Millisecond), first)
	}
	fmt.Fprintf(w, "%s\n", genElectEnd)
}

// UpdateGenElectSection rewrites the elector row's section of the report
// at path from the rows kept in rowsPath.
func UpdateGenElectSection(path, rowsPath string) error {
	return updateRowsSection(path, rowsPath, WriteGenElectSection, genElectBegin, genElectEnd, genElectBefore)
}
