package proof

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"
)

// GenPartRow is one partitions run (RunGenPartitions) as the report shows
// it.
type GenPartRow struct {
	// Build names the code that ran: "main", or the fix reverted.
	Build   string `json:"build"`
	Backend string `json:"backend"`
	// Mode is "slice" (the normal suite) or "long".
	Mode   string        `json:"mode"`
	Report GenPartReport `json:"report"`
	Date   string        `json:"date"`
}

// Markers around the partitions row's section of docs/proof.md.
const (
	genPartBegin = "<!-- generative-partitions: begin -->"
	genPartEnd   = "<!-- generative-partitions: end -->"
	// genPartBefore is the heading the section goes before when the
	// report has none yet.
	genPartBefore = "## Partitioned ownership (recipe.Partitions)"
)

// ReadGenPartRows reads the rows kept in path (a JSON array).
func ReadGenPartRows(path string) ([]GenPartRow, error) { return readRows[GenPartRow](path) }

// SaveGenPartRow adds row to the rows kept in path, replacing the row of the
// same build, backend and mode; main's rows come first.
func SaveGenPartRow(path string, row GenPartRow) error { return saveRow(path, row) }

// key names what the row ran.
func (r GenPartRow) key() rowKey { return rowKey{r.Build, r.Backend, r.Mode} }

const genPartPreamble = `The partitions row of the generative proof (proof.RunGenPartitions; ` +
	"`go test ./internal/cli/proof -run TestGenerativePartitions`" + `
in the normal suite, 40 s of churn on each of SQLite, Redis, PostgreSQL and etcd; ` + "`FENCED_PROOF_PART_DURATION`" + ` for longer
runs, ` + "`FENCED_PROOF_SEED`" + ` to rerun one):
4 member processes of one group, 1 s leases, 64 items routed as users route them (item → partition
FNV-1a(item) mod P). Every 15 ms each owned partition writes one of its items to a SQLite resource, guarded by
fence.SQL on the partition's row, logging (member, P, partition, fence, item) in the same transaction; after its
context ends it writes once more, so that the resource, not the member's belief, must refuse. A nemesis drawn from
the seed, every 0.3-1.5 TTLs: kill -9 (restarted within a TTL), SIGSTOP for 1.5-3 TTLs, leave (SIGTERM, restarted),
or deploy: a new P from {2, 3, 4, 6, 8}, every member ended (leave or kill -9 at random) and started again with it,
except, two deploys in three, one member SIGSTOPped at the old P beforehand and continued 1.5-3 TTLs later. A member
that stops by itself (ErrPartitionCount, ErrMemberLive: *exits*) is started again with the current P, as a
supervisor would; any other exit fails the row. Checks: *overlaps*: no two ownerships certainly held at the
authority at once cover a common item (an ownership is held from the start of its work to the last instant its
member saw the lease's local validity reach past now with its context live: one CLOCK_MONOTONIC, no tolerance);
*stale accepted*: on each partition's row the accepted fences never go down; *longest unowned*: no partition of the
live members' P goes without a lease longer than the store's keep of a dead grant + a renewal period (TTL/3) + a
poll (TTL/3) + 200 ms of listing + 3 × the scheduling delay measured in the run + 2 × the longest listing (the
take-over's and the observer's store round trips; *bound*; on SQLite plus the longest SIGSTOP of the run: a member
stopped inside a write of the store's file holds its lock for the whole stop).
*Checkpoints*: every 4th write, and once more after its context ended, the work records "fence:step" as the
partition's checkpoint (fenced.Lease.Checkpoint), logging the try and its outcome; each ownership logs the
checkpoint it started from (recipe.Partition.Checkpoint). *Stale checkpoints accepted*: a checkpoint accepted under
a fence after a later grant of its partition had started its work (must be 0); *continuity breaks*: an ownership
that did not start from the last checkpoint accepted under an earlier fence (or from one of unknown outcome that is
later than it: a try whose member was killed before logging it, or that failed with an error) (must be 0).
*Late item writes* counts accepted writes of an item by an ownership after another ownership had written it
(A, B, then A again). It is reported, not failed, because no lease can prevent it: a member stopped at the old P
during a deploy, holding partition k with k ≥ the new P, writes once more when it resumes (the members here
always write once after their context ends, as a member stopped between its look at the context and its write
does); the new count never takes key k, so the row of partition k has seen
no newer fence and the guard accepts the write, though the new count has meanwhile worked the same items under
other keys. Main's sqlite run of seed 1796481836732472437 showed it (items 20 and 28, partition 3 of 8, after a
deploy 8 → 3). A resource keyed by partition is fenced per partition only; when P changes, items move between
rows, and nothing fences the move.
On PostgreSQL and etcd (added later), seed 1796494793104781826, 44-45 s each: postgres 2196 writes accepted,
etcd 2614, 3 deploys each (counts 2, 3, 4); overlaps 0, stale accepted 0; longest unowned 563 ms (bound 2.70 s) and
341 ms (bound 3.96 s).
Rows other than main ran with the named fix reverted locally; "first violation" is how far into the run it came.

With eae438c reverted (a member that lapsed takes its membership back without looking at the group's count) the
row fails on every run so far, at the first deploy that leaves a member stopped at the old P: seed
1796481112532802180 on SQLite 17.6 s in; seed 1796481371196871601 on SQLite 12.2 s, 39.2 s and 12.3 s in (three
runs: the schedule is the seed's, its timing the machine's) and on Redis 12.2 s, 12.5 s and 12.6 s in. The member
resumes at its old count, the others' count is not its own, it takes the partitions they do not hold, and an item
is held under two keys at once for 0.5-5 s. On main, 4 slice runs (one with four CPU hogs alongside) and the two
3-minute runs above found no overlap, no stale write accepted, and every partition owned again within its bound.

`

// WriteGenPartSection writes the partitions row's section (between its
// markers).
func WriteGenPartSection(w io.Writer, rows []GenPartRow) {
	fmt.Fprintf(w, "%s\n## Partitions in the generative proof\n\n%s", genPartBegin, genPartPreamble)
	if len(rows) == 0 {
		fmt.Fprintf(w, "Not run yet.\n%s\n", genPartEnd)
		return
	}
	fmt.Fprintln(w,
		"| build | backend | mode | seed | seconds | faults (kill / stop / leave / deploy) "+
			"| exits | ownerships | counts | writes accepted / refused | overlaps | stale accepted | late item writes "+
			"| checkpoints accepted / refused | started from one | stale checkpoints accepted | continuity breaks | longest unowned "+
			"(bound) | weights, threshold, dampening, max in transition | balanced by weight after the churn (bound) | first violation |")
	fmt.Fprintln(w, "|---|---|---|---|---:|---|---|---:|---|---|---:|---:|---:|---|---:|---:|---:|---|---|---|---|")
	for _, r := range rows {
		rep := r.Report
		first := "none"
		if rep.Failed() {
			first = fmt.Sprintf("%v in", rep.FirstViolation.Round(100*time.Millisecond))
		}
		var exits []string
		for code, n := range rep.Exits {
			exits = append(exits, fmt.Sprintf("%d×%d", n, code))
		}
		sort.Strings(exits)
		fmt.Fprintf(w, "| %s | %s | %s | %d | %.0f | %d / %d / %d / %d | %s | %d | %v | %d / %d | %d | %d | %d "+
			"| %d / %d | %d | %d | %d | %v (%v) | %s | %v (%v) | %s |\n",
			r.Build, r.Backend, r.Mode, rep.Seed, rep.Duration.Seconds(), rep.Faults["kill"], rep.Faults["stop"], rep.Faults["leave"],
			rep.Faults["deploy"],
			strings.Join(exits, " "), rep.Ownerships, rep.Counts, rep.WritesAccepted, rep.WritesRefused, rep.Overlaps, rep.StaleAccepted,
			rep.LateItemWrites, rep.CheckpointsAccepted, rep.CheckpointsRefused, rep.CheckpointStarts, rep.StaleCheckpoints,
			rep.CheckpointBreaks,
			rep.LongestUnowned.Round(time.Millisecond), rep.Bound.Round(time.Millisecond), rep.Knobs,
			rep.Converge.Round(time.Millisecond), rep.ConvergeBound.Round(time.Millisecond), first)
	}
	fmt.Fprintf(w, "%s\n", genPartEnd)
}

// UpdateGenPartSection rewrites the partitions row's section of the report
// at path from the rows kept in rowsPath.
func UpdateGenPartSection(path, rowsPath string) error {
	return updateRowsSection(path, rowsPath, WriteGenPartSection, genPartBegin, genPartEnd, genPartBefore)
}
