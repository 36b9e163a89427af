package proof

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"time"
)

// GenJobsReport is the checked outcome of a jobs run (RunGenJobs).
type GenJobsReport struct {
	Seed     uint64
	Duration time.Duration
	// Faults counts the nemesis's faults by kind (kill, stop, leave,
	// break); Exits the schedulers that stopped by themselves, by exit
	// code (each a failure).
	Faults map[string]int
	Exits  map[int]int
	// Runs counts the runs that started, by scheduler kind; Ticks the
	// tick slots with an accepted write, by kind.
	Runs, Ticks map[string]int
	// WritesAccepted counts the resource's accepted writes, WritesRefused
	// those the guard refused.
	WritesAccepted, WritesRefused int
	// TwiceForTick counts tick slots in which two runs (fences) of a job
	// had a write accepted, the later one started within the MinHold of
	// the tick. Must be 0.
	TwiceForTick int
	// LateTwice counts tick slots in which two runs of a job had a write
	// accepted, the later one started more than the MinHold into the
	// slot: a scheduler that fired late (resumed from SIGSTOP, starved)
	// catches up a tick it missed once the lease of the tick's run has
	// been released. The adapters promise one run per tick only for a
	// tick spread within the MinHold; reported, see docs/proof.md.
	LateTwice int
	// FirstLateTwice describes the first late double run.
	FirstLateTwice string
	// BrokenTwice counts tick slots run again because the lease of the
	// tick's first run was broken (Client.Break) before the second run
	// started: a break frees the key at once, and a scheduler firing the
	// same tick a little later takes it, as the break means it to.
	// Reported, not failed.
	BrokenTwice int
	// StaleAccepted counts accepted writes whose fence is below one the
	// job's row had accepted before (or equal to it, from another
	// process). Must be 0.
	StaleAccepted int
	// LiveAfterNext counts runs whose context was seen live after the
	// next run's first accepted write, among the runs the check covers
	// (ContextChecked: neither stopped nor broken). Must be 0.
	LiveAfterNext, ContextChecked int
	// ContextLost counts the checked runs whose lease ended before they
	// returned (expired or lost while their process ran).
	ContextLost int
	// LongestGap is the longest a job went without an accepted write
	// during the churn; Bound what it must stay under; MaxSchedDelay
	// the measured scheduling delay and Stall the longest stop the bound
	// is derived from.
	LongestGap, Bound, MaxSchedDelay, Stall time.Duration
	// Problems describes each violation; FirstViolation is how far into
	// the run the first one happened.
	Problems       []string
	FirstViolation time.Duration
}

// Failed reports whether any check failed.
func (r GenJobsReport) Failed() bool { return len(r.Problems) > 0 }

// genJobsLiveness is what the liveness check needs: the churn's span on
// CLOCK_MONOTONIC, the TTL, the measured scheduling delay and the longest
// stall a stopped scheduler can cause.
type genJobsLiveness struct {
	From, To          int64
	TTL, Delay, Stall time.Duration
}

// jobRun is one run as its scheduler logged it and the resource saw it.
type jobRun struct {
	job, kind string
	pid       int64
	fence     uint64
	tick      int64
	start     int64
	late      time.Duration // how far into its tick slot it started
	// first is when its first accepted write had committed (0: none);
	// live the last instant it saw its context live.
	first, live int64
	// lost is why its lease ended before it returned ("": it had not).
	lost string
}

type jobRunKey struct {
	job   string
	fence uint64
}

// CheckGenJobs judges a jobs run from its schedulers' history, the
// resource's accepted writes (in commit order) and the nemesis's faults:
//
//   - no tick ran twice: in each tick slot (the second a run started in;
//     the job is due every second) at most one run (fence) of a job had a
//     write accepted. The adapters promise it for schedulers that fire
//     within the MinHold of the tick: a second run that started later into
//     the slot (a scheduler resumed or starved, catching up a tick it
//     missed after the lease of the tick's run was released) is counted
//     apart (LateTwice), not failed, as is a second run after the first
//     one's lease was broken (BrokenTwice);
//   - no stale write accepted: on each job's row, the accepted fences
//     never go down (nor repeat from another process);
//   - a run whose lease was lost while its process ran (expired: the
//     store unreachable or stalled, renewals late) has its context ended
//     before the next run's first accepted write: no instant it saw its
//     context live comes after that write's commit (one CLOCK_MONOTONIC,
//     no tolerance). Runs whose process was stopped, or whose lease was
//     broken, between their start and that write are not covered: a
//     stopped process cannot act, and the holder of a broken lease learns
//     of it only at its next renewal; for them only "no stale write
//     accepted" can hold, and is checked;
//   - liveness: during the churn, each job has an accepted write at least
//     every TTL (a lease left behind by a killed or stopped scheduler) +
//     2 × the interval (the tick whose run had ended, then the next tick)
//   - 3 × the measured scheduling delay (firing, grant, write) + the
//     longest stop or stall (a scheduler stopped inside a write of a
//     SQLite file holds its lock; the stall holds the store's).
func CheckGenJobs(events []jobEvent, writes []jobWrite, faults []jobFault, lv genJobsLiveness, exits map[int]int) GenJobsReport {
	c := &jobsChecker{
		rep:        GenJobsReport{Faults: map[string]int{}, Exits: exits, Runs: map[string]int{}, Ticks: map[string]int{}},
		violations: violations{t0: lv.From, first: -1, since: "churn"},
		faults:     faults,
		runs:       map[jobRunKey]*jobRun{},
		last:       map[string]jobWrite{},
		ticks:      map[string]map[int64]uint64{},
	}
	c.problems = &c.rep.Problems
	for _, f := range faults {
		c.rep.Faults[f.Kind]++
	}
	c.collect(events)
	for _, w := range writes {
		c.checkWrite(w)
	}
	c.checkContexts()
	c.checkLiveness(writes, lv)
	if c.first >= 0 {
		c.rep.FirstViolation = time.Duration(c.first - c.t0)
	}
	return c.rep
}

// jobsChecker holds what CheckGenJobs has learnt of a run.
// It fills rep as it goes.
type jobsChecker struct {
	rep GenJobsReport
	violations
	faults []jobFault
	runs   map[jobRunKey]*jobRun
	// last is each job's accepted write of the highest fence so far.
	last map[string]jobWrite
	// ticks holds, per job and tick slot, the fence of its latest run.
	ticks map[string]map[int64]uint64
}

// run returns job's run of fence f, making it on first use.
func (c *jobsChecker) run(job string, f uint64) *jobRun {
	k := jobRunKey{job, f}
	r := c.runs[k]
	if r == nil {
		r = &jobRun{job: job, fence: f}
		c.runs[k] = r
	}
	return r
}

// collect gathers the runs from the schedulers' history.
func (c *jobsChecker) collect(events []jobEvent) {
	for _, e := range events {
		r := c.run(e.Job, e.Fence)
		r.kind, r.pid, r.tick = e.Kind, int64(e.PID), e.Tick
		switch e.K {
		case "start":
			r.start, r.late = e.T, e.Late
			c.rep.Runs[e.Kind]++
		case "first":
			r.first = e.T
		case "end":
			r.live, r.lost = max(r.live, e.Live), e.Lost
			c.rep.WritesRefused += e.Refused
		}
	}
}

// broken reports whether the lease of fence f was broken by at.
func (c *jobsChecker) broken(f uint64, at int64) bool {
	for _, x := range c.faults {
		if x.Kind == "break" && x.Fence == f && x.From <= at {
			return true
		}
	}
	return false
}

// checkWrite takes in one accepted write, in commit order. It checks that
// the job's fences do not go down, and that its tick ran once.
func (c *jobsChecker) checkWrite(w jobWrite) {
	c.rep.WritesAccepted++
	r := c.run(w.Job, w.Fence)
	if r.kind == "" {
		r.kind, r.pid, r.tick, r.start = w.Kind, w.PID, w.Tick, w.T
	}
	if w.Live {
		r.live = max(r.live, w.T) // a killed run logs no end
	}
	if prev, ok := c.last[w.Job]; ok && (w.Fence < prev.Fence || w.Fence == prev.Fence && w.PID != prev.PID) {
		c.rep.StaleAccepted++
		c.violation(w.T, "stale write accepted on job %s: fence %d (pid %d) after fence %d (pid %d)", w.Job, w.Fence, w.PID, prev.Fence,
			prev.PID)
	}
	if prev, ok := c.last[w.Job]; !ok || w.Fence >= prev.Fence {
		c.last[w.Job] = w
	}
	if c.ticks[w.Job] == nil {
		c.ticks[w.Job] = map[int64]uint64{}
	}
	switch other, ok := c.ticks[w.Job][w.Tick]; {
	case !ok:
		c.ticks[w.Job][w.Tick] = w.Fence
		c.rep.Ticks[w.Kind]++
	case other != w.Fence:
		c.ticks[w.Job][w.Tick] = w.Fence
		c.ranTwice(w, c.runs[jobRunKey{w.Job, other}], r)
	}
}

// ranTwice judges runs a and b of w's job, which both wrote for w's tick.
func (c *jobsChecker) ranTwice(w jobWrite, a, b *jobRun) {
	if a.start > b.start {
		a, b = b, a
	}
	what := fmt.Sprintf("job %s (%s) ran twice for tick %s: fences %d (pid %d, %v into the slot) and %d (pid %d, %v into the slot) "+
		"both had writes accepted",
		w.Job, w.Kind, time.Unix(w.Tick, 0).UTC().Format("15:04:05"), a.fence, a.pid, a.late.Round(time.Millisecond), b.fence, b.pid,
		b.late.Round(time.Millisecond))
	if c.broken(a.fence, b.start) {
		c.rep.BrokenTwice++
		return
	}
	if b.late > genJobsMinHold {
		c.rep.LateTwice++
		if c.rep.LateTwice == 1 {
			c.rep.FirstLateTwice = what
		}
		return
	}
	c.rep.TwiceForTick++
	c.violation(w.T, "%s", what)
}

// excused reports whether r's lease was broken, or its process stopped,
// between its start and to.
func (c *jobsChecker) excused(r *jobRun, to int64) bool {
	if c.broken(r.fence, to) {
		return true
	}
	for _, f := range c.faults {
		switch {
		case f.Kind == "stop" && int64(f.PID) == r.pid && f.From <= to && f.To >= r.start:
			return true
		}
	}
	return false
}

// checkContexts checks, per job, that each run's context ended before the
// next run's first accepted write.
func (c *jobsChecker) checkContexts() {
	// Per job, the runs with an accepted write, in fence order.
	byJob := map[string][]*jobRun{}
	for _, r := range c.runs {
		if r.first > 0 {
			byJob[r.job] = append(byJob[r.job], r)
		}
	}
	for job, rs := range byJob {
		slices.SortFunc(rs, func(a, b *jobRun) int {
			if a.fence < b.fence {
				return -1
			}
			return 1
		})
		for i, r := range rs[:max(0, len(rs)-1)] {
			next := rs[i+1]
			if c.excused(r, next.first) {
				continue
			}
			c.rep.ContextChecked++
			if r.lost != "" {
				c.rep.ContextLost++
			}
			if r.live > next.first {
				c.rep.LiveAfterNext++
				c.violation(next.first,
					"job %s: the run with fence %d (pid %d) saw its context live %v after the next run's (fence %d, pid %d) "+
						"first accepted write",
					job, r.fence, r.pid, time.Duration(r.live-next.first).Round(time.Millisecond), next.fence, next.pid)
			}
		}
	}
}

// checkLiveness measures each job's longest gap between accepted writes
// over the churn, and checks it against its bound.
func (c *jobsChecker) checkLiveness(writes []jobWrite, lv genJobsLiveness) {
	rep := &c.rep
	at := map[string][]int64{}
	for _, w := range writes {
		if w.T >= lv.From && w.T <= lv.To {
			at[w.Job] = append(at[w.Job], w.T)
		}
	}
	jobs := map[string]bool{}
	for k := range c.runs {
		jobs[k.job] = true
	}
	for job := range jobs {
		ts := at[job]
		slices.Sort(ts)
		ts = append(append([]int64{lv.From}, ts...), lv.To)
		if len(ts) > 2 {
			ts = ts[1:] // the first run after the start is not judged
		}
		for i := 1; i < len(ts); i++ {
			if gap := time.Duration(ts[i] - ts[i-1]); gap > rep.LongestGap {
				rep.LongestGap = gap
			}
		}
	}
	rep.MaxSchedDelay, rep.Stall = lv.Delay, lv.Stall
	rep.Bound = lv.TTL + 2*genJobsInterval + 3*lv.Delay + lv.Stall
	if rep.LongestGap > rep.Bound {
		rep.Problems = append(rep.Problems,
			fmt.Sprintf("a job went %v without an accepted write (bound %v = the TTL %v + 2 × the interval %v + 3 × the measured "+
				"scheduling delay %v + the longest stop or stall %v)",
				rep.LongestGap.Round(time.Millisecond), rep.Bound.Round(time.Millisecond), lv.TTL, genJobsInterval,
				lv.Delay.Round(time.Millisecond), lv.Stall.Round(time.Millisecond)))
	}
}

// readJobHistory reads a jobs run's history.
func readJobHistory(path string) ([]jobEvent, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("proof: read history: %w", err)
	}
	defer f.Close()
	var evs []jobEvent
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		var e jobEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("proof: history %s line %d: %w", path, n, err)
		}
		evs = append(evs, e)
	}
	return evs, sc.Err()
}
