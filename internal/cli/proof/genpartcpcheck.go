package proof

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// cpTry is one checkpoint a partition's work tried to record (history
// lines "cptry" and "cp"): fence:step, the grant's fence and its step.
type cpTry struct {
	part        int
	value       string
	fence       uint64
	step        int
	start, done int64 // Now at the try and at its outcome (0: none logged)
	res         string
	member      string
	pid         int
}

// after reports whether t was recorded later than u by its grant: a higher
// fence, or the same fence and a later step.
func (t *cpTry) after(u *cpTry) bool {
	return t.fence > u.fence || t.fence == u.fence && t.step > u.step
}

// parseCheckpoint reads "fence:step".
func parseCheckpoint(v string) (fence uint64, step int, ok bool) {
	f, s, found := strings.Cut(v, ":")
	if !found {
		return 0, 0, false
	}
	fence, err1 := strconv.ParseUint(f, 10, 64)
	step, err2 := strconv.Atoi(s)
	return fence, step, err1 == nil && err2 == nil
}

// CheckpointEvent is one line of a checkpoint history: Kind "own" (an
// ownership's work started from checkpoint CP, "" for none), "cptry" (its
// work tries to record CP, "fence:step") or "cp" (the try's outcome Res:
// "ok", "refused" for ErrNotHeld, "err" for any other error). T is one
// clock shared by every process of the run.
type CheckpointEvent struct {
	Kind, Member, CP, Res string
	T                     int64
	PID, Part             int
	Fence                 uint64
}

// CheckpointCounts are what the checkpoint checks counted (see
// judgeCheckpoints): tries accepted and refused, ownerships that started
// from a checkpoint, and the violations: stale checkpoints accepted and
// breaks of continuity.
type CheckpointCounts struct {
	Accepted, Refused, Starts int
	Stale, Breaks             int
	// Parts are the partitions with a violation, in the order found.
	Parts []int
}

// CheckCheckpoints judges a checkpoint history (judgeCheckpoints) and
// describes each violation.
func CheckCheckpoints(evs []CheckpointEvent) (CheckpointCounts, []string) {
	var problems []string
	n := judgeCheckpoints(evs, func(_ int64, format string, args ...any) {
		problems = append(problems, fmt.Sprintf(format, args...))
	})
	return n, problems
}

// checkCheckpoints judges the checkpoints of a partitions run.
func (c *partChecker) checkCheckpoints(events []partEvent) {
	var evs []CheckpointEvent
	for _, e := range events {
		evs = append(evs, CheckpointEvent{Kind: e.K, Member: e.Member, CP: e.CP, Res: e.Res, T: e.T, PID: e.PID, Part: e.Part,
			Fence: e.Fence})
	}
	n := judgeCheckpoints(evs, c.violation)
	c.rep.CheckpointsAccepted, c.rep.CheckpointsRefused, c.rep.CheckpointStarts = n.Accepted, n.Refused, n.Starts
	c.rep.StaleCheckpoints, c.rep.CheckpointBreaks = n.Stale, n.Breaks
}

// judgeCheckpoints judges a checkpoint history, calling bad for each
// violation:
//
//   - no stale checkpoint accepted: a checkpoint recorded under fence F'
//     is refused once the history shows a later grant F > F' of its
//     partition starting its work before the try began;
//   - continuity: every grant F starts from the last checkpoint recorded
//     under an earlier grant of its partition. It must be a try of an
//     earlier fence that was not refused (accepted, or of unknown outcome:
//     an error, or a member killed before it logged the outcome), and no
//     accepted try of an earlier fence may be later than it. A grant that
//     starts from nothing must have no accepted earlier try.
//
// Tries with fence ≥ F are later grants' and play no part for F.
func judgeCheckpoints(events []CheckpointEvent, bad func(at int64, format string, args ...any)) CheckpointCounts {
	var n CheckpointCounts
	tries := map[string]*cpTry{} // by partition and value
	byPart := map[int][]*cpTry{}
	var owns []CheckpointEvent
	for _, e := range events {
		switch e.Kind {
		case "own":
			owns = append(owns, e)
		case "cptry", "cp":
			id := strconv.Itoa(e.Part) + "/" + e.CP
			t := tries[id]
			if t == nil {
				f, s, ok := parseCheckpoint(e.CP)
				if !ok {
					bad(e.T, "partition %d: checkpoint %q by %s is not fence:step", e.Part, e.CP, e.Member)
					continue
				}
				t = &cpTry{part: e.Part, value: e.CP, fence: f, step: s, member: e.Member, pid: e.PID}
				tries[id] = t
				byPart[e.Part] = append(byPart[e.Part], t)
			}
			if e.Kind == "cptry" {
				t.start = e.T
			} else {
				t.done, t.res = e.T, e.Res
			}
		}
	}
	for _, t := range tries {
		switch t.res {
		case "ok":
			n.Accepted++
		case "refused":
			n.Refused++
		}
	}
	for _, o := range owns {
		if o.CP != "" {
			n.Starts++
		}
		var last *cpTry // the last accepted try of an earlier fence
		for _, t := range byPart[o.Part] {
			if t.fence >= o.Fence {
				continue
			}
			if t.res == "ok" && t.start > o.T {
				n.Stale++
				n.flag(t.part)
				bad(t.start, "stale checkpoint accepted on partition %d: %q by %s (pid %d) under fence %d, "+
					"begun after fence %d's work started", t.part, t.value, t.member, t.pid, t.fence, o.Fence)
				continue // counted; continuity is judged on the tries before o
			}
			if t.res == "ok" && (last == nil || t.after(last)) {
				last = t
			}
		}
		if o.CP == "" {
			if last != nil {
				n.Breaks++
				n.flag(o.Part)
				bad(o.T, "partition %d: %s's fence %d started from no checkpoint, the last accepted before it is %q",
					o.Part, o.Member, o.Fence, last.value)
			}
			continue
		}
		got := tries[strconv.Itoa(o.Part)+"/"+o.CP]
		switch {
		case got == nil || got.fence >= o.Fence || got.res == "refused":
			n.Breaks++
			n.flag(o.Part)
			bad(o.T, "partition %d: %s's fence %d started from checkpoint %q, which no earlier grant recorded (%s)",
				o.Part, o.Member, o.Fence, o.CP, describeTry(got))
		case last != nil && last.after(got):
			n.Breaks++
			n.flag(o.Part)
			bad(o.T, "partition %d: %s's fence %d started from checkpoint %q, the last accepted before it is %q",
				o.Part, o.Member, o.Fence, o.CP, last.value)
		}
	}
	return n
}

// flag adds part to n.Parts once.
func (n *CheckpointCounts) flag(part int) {
	if !slices.Contains(n.Parts, part) {
		n.Parts = append(n.Parts, part)
	}
}

// describeTry says what the history holds of t.
func describeTry(t *cpTry) string {
	if t == nil {
		return "never tried"
	}
	res := t.res
	if res == "" {
		res = "no outcome logged"
	}
	return fmt.Sprintf("tried by %s under fence %d: %s", t.member, t.fence, res)
}
