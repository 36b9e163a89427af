package proof

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"time"
)

// GenJobsRow is one jobs run (RunGenJobs) as the report shows it.
type GenJobsRow struct {
	// Build names the code that ran: "main", the fix reverted, or the
	// hazard switch.
	Build   string        `json:"build"`
	Backend string        `json:"backend"`
	Report  GenJobsReport `json:"report"`
	Date    string        `json:"date"`
}

// Markers around the jobs row's section of docs/proof.md.
const (
	genJobsBegin = "<!-- generative-jobs: begin -->"
	genJobsEnd   = "<!-- generative-jobs: end -->"
	// genJobsBefore is the heading the section goes before when the
	// report has none yet.
	genJobsBefore = genPartBefore
)

// SaveGenJobsRow adds row to the rows kept in path (a JSON array),
// replacing the row of the same build and backend; main's rows come
// first.
func SaveGenJobsRow(path string, row GenJobsRow) error {
	rows, err := readGenJobsRows(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	kept := rows[:0]
	for _, r := range rows {
		if r.Build != row.Build || r.Backend != row.Backend {
			kept = append(kept, r)
		}
	}
	kept = append(kept, row)
	sort.SliceStable(kept, func(i, j int) bool {
		a, b := kept[i], kept[j]
		if (a.Build == "main") != (b.Build == "main") {
			return a.Build == "main"
		}
		return a.Build < b.Build || a.Build == b.Build && a.Backend < b.Backend
	})
	b, err := json.MarshalIndent(kept, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

func readGenJobsRows(path string) ([]GenJobsRow, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var rows []GenJobsRow
	if err := json.Unmarshal(b, &rows); err != nil {
		return nil, fmt.Errorf("proof: %s: %w", path, err)
	}
	return rows, nil
}

const genJobsPreamble = `The scheduler adapters' row of the generative proof (proof.RunGenJobs; ` + "`go test ./internal/proof -run TestGenerativeJobs`" + `
in the normal suite, 40 s of churn on SQLite; ` + "`FENCED_PROOF_JOBS_DURATION`" + ` for longer runs, ` + "`FENCED_PROOF_SEED`" + ` to rerun one):
3 gocron schedulers (fencedgocron.Locker, the job made with Locker.Task) and 3 robfig/cron schedulers
(fencedcron.SkipIfHeld, a fencedcron.LeaseFunc job), each a separate process, each kind running its own job due
every second on the second (cron ` + "`* * * * * *`" + `), 1 s leases, the adapters' default MinHold (500 ms). A run writes 6
times, 50 ms apart, to a SQLite resource, guarded by fence.SQL on the job's row with the run's lease, logging
(scheduler, tick, fence, pid, CLOCK_MONOTONIC instant, whether its context was live) in the same transaction; once
its context has ended it writes once more, so that the resource, not the run's belief, must refuse. A nemesis drawn
from the seed, every 0.3-1.5 TTLs: kill -9 of a scheduler (restarted within a TTL), SIGSTOP for 1.5-3 TTLs, leave
(SIGTERM: the scheduler shuts down; restarted within half a TTL), or admin.Break of a job's lease. Checks:
*twice for a tick*: in each tick slot (the second a run started in) at most one run (fence) of a job has a write
accepted; *stale accepted*: on each job's row the accepted fences never go down; *live after next*: a run whose lease
was lost while its process ran (expired: renewals late or the store stalled) has its context ended before the next
run's first accepted write commits (no instant it saw its context live comes after it; one CLOCK_MONOTONIC, no
tolerance). Runs whose scheduler was stopped, or whose lease was broken, before that write are not covered (*checked*
counts the covered runs): a stopped process cannot act, and the holder of a broken lease learns of it only at its
next renewal, so for them only "no stale write accepted" can hold, and it is checked. *Longest gap*: each job has a
run's accepted write at least every TTL (a lease left behind by a killed or stopped scheduler) + the interval (1 s)
+ 3 × the scheduling delay measured in the run + the longest SIGSTOP (a scheduler stopped inside a write of a
SQLite file holds its lock for the whole stop) (*bound*). The hazard row ran with ` + "`FENCED_PROOF_JOBS_HAZARD=1`" + `: the
jobs ignore their lease's context and write without the guard; it must fail.

`

// WriteGenJobsSection writes the jobs row's section (between its
// markers).
func WriteGenJobsSection(w io.Writer, rows []GenJobsRow) {
	fmt.Fprintf(w, "%s\n## Scheduler adapters in the generative proof\n\n%s", genJobsBegin, genJobsPreamble)
	if len(rows) == 0 {
		fmt.Fprintf(w, "Not run yet.\n%s\n", genJobsEnd)
		return
	}
	fmt.Fprintln(w, "| build | backend | seed | seconds | faults (kill / stop / leave / break) | runs (gocron / cron) | ticks run (gocron / cron) | writes accepted / refused | twice for a tick | stale accepted | live after next (checked) | longest gap (bound) | first violation |")
	fmt.Fprintln(w, "|---|---|---|---:|---|---|---|---|---:|---:|---|---|---|")
	for _, r := range rows {
		rep := r.Report
		first := "none"
		if rep.Failed() {
			first = fmt.Sprintf("%v in", rep.FirstViolation.Round(100*time.Millisecond))
		}
		fmt.Fprintf(w, "| %s | %s | %d | %.0f | %d / %d / %d / %d | %d / %d | %d / %d | %d / %d | %d | %d | %d (%d) | %v (%v) | %s |\n",
			r.Build, r.Backend, rep.Seed, rep.Duration.Seconds(), rep.Faults["kill"], rep.Faults["stop"], rep.Faults["leave"], rep.Faults["break"],
			rep.Runs[schedGocron], rep.Runs[schedCron], rep.Ticks[schedGocron], rep.Ticks[schedCron], rep.WritesAccepted, rep.WritesRefused,
			rep.TwiceForTick, rep.StaleAccepted, rep.LiveAfterNext, rep.ContextChecked,
			rep.LongestGap.Round(time.Millisecond), rep.Bound.Round(time.Millisecond), first)
	}
	fmt.Fprintf(w, "%s\n", genJobsEnd)
}

// UpdateGenJobsSection rewrites the jobs row's section of the report at
// path from the rows kept in rowsPath.
func UpdateGenJobsSection(path, rowsPath string) error {
	rows, err := readGenJobsRows(rowsPath)
	if err != nil {
		return err
	}
	var sec bytes.Buffer
	WriteGenJobsSection(&sec, rows)
	return updateSection(path, genJobsBegin, genJobsEnd, genJobsBefore, sec.Bytes())
}
