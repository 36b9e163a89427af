package proof

import (
	"sort"
	"time"

	"github.com/fenced-dev/fenced"
)

// exclusionSlack is how long a lease's recorded end may follow the
// recorded grant of the same key to another owner: the lease's context
// ends up to the grace after its validity, which ends no later than the
// store frees the key, and the worker records the end (a Lost hook or its
// release) a moment later.
const exclusionSlack = 300 * time.Millisecond

// faultWindow is when a fault was active, on a worker (-1: the
// authority).
type faultWindow struct {
	start, end int64
	worker     int
	fault      string
}

// leaseLife is one granted lease: from its grant (ok) to the first
// record of its end (its Lost event, or its release), 0 if none.
type leaseLife struct {
	key, owner string
	fence      uint64
	worker     int
	ttl        time.Duration
	ok, end    int64
}

// checkExclusion adds two checks to a generative report. A lease outlives
// a break: it is seen live (its end not yet recorded) more than its TTL
// plus exclusionSlack after a Break of its grant completed (every
// renewal sent after the break fails, so its validity ends by then). Two
// owners hold one key: a lease's end is recorded more than
// exclusionSlack after another owner's grant of its key, with no break of
// the key while the first lived (nor of the first's grant itself, however
// late that grant was recorded), its worker not stopped (PauseHolder)
// meanwhile, and, on a backend whose fence may repeat (its data may be
// lost), the authority not restarted (CrashAuthority) meanwhile. faults
// are the run's fault windows.
func checkExclusion(r *GenReport, events []Event, strength fenced.FenceStrength, faults []faultWindow) {
	x := &exclusionChecker{r: r, strength: strength, faults: faults, breaks: map[string][]leaseBreak{}}
	x.collect(events)
	byKey := map[string][]*leaseLife{}
	for _, l := range x.lives {
		byKey[l.key] = append(byKey[l.key], l)
		x.checkBreaks(l)
	}
	for key, ls := range byKey {
		x.checkOverlaps(key, ls)
	}
}

// leaseBreak is one Break of a grant that succeeded: when it was invoked,
// when it completed, and the grant it broke (its fence and owner digest).
type leaseBreak struct {
	invoke, done int64
	fence        uint64
	owner        string
}

// of reports whether b broke l's grant itself: the same fence and owner.
func (b leaseBreak) of(l *leaseLife) bool { return b.fence == l.fence && b.owner == l.owner }

// exclusionChecker holds what checkExclusion needs of a history.
type exclusionChecker struct {
	r        *GenReport
	strength fenced.FenceStrength
	faults   []faultWindow
	lives    []*leaseLife            // in the order they were granted
	breaks   map[string][]leaseBreak // by key
}

// collect gathers the leases' lives and the breaks from the history.
func (x *exclusionChecker) collect(events []Event) {
	type lk struct {
		worker int
		key    string
		fence  uint64
	}
	open := map[lk][]*leaseLife{}
	breakInvoke := map[int64]int64{}
	for _, e := range events {
		k := lk{e.Worker, e.Key, e.Fence}
		switch e.Kind {
		case AcquireOK, SetMember:
			l := &leaseLife{key: e.Key, owner: e.Owner, fence: e.Fence, worker: e.Worker, ttl: e.TTL, ok: e.T}
			x.lives = append(x.lives, l)
			open[k] = append(open[k], l)
		case Lost, ReleaseInvoke:
			if ls := open[k]; len(ls) > 0 {
				ls[0].end = e.T
				open[k] = ls[1:]
			}
		case BreakInvoke:
			breakInvoke[e.Op] = e.T
		case BreakDone:
			if e.Err == "" && e.Fence != 0 {
				inv, ok := breakInvoke[e.Op]
				if !ok {
					inv = e.T
				}
				x.breaks[e.Key] = append(x.breaks[e.Key], leaseBreak{inv, e.T, e.Fence, e.Owner})
			}
		}
	}
}

// stopped reports whether worker was stopped (PauseHolder) in [from, to].
func (x *exclusionChecker) stopped(worker int, from, to int64) bool {
	for _, f := range x.faults {
		if f.fault == string(PauseHolder) && f.worker == worker && f.start <= to && f.end >= from {
			return true
		}
	}
	return false
}

// restarted reports whether an authority whose fence may repeat was
// restarted (CrashAuthority) in [from, to].
func (x *exclusionChecker) restarted(from, to int64) bool {
	if x.strength >= fenced.FenceStrict {
		return false
	}
	for _, f := range x.faults {
		if f.fault == string(CrashAuthority) && f.start <= to && f.end >= from {
			return true
		}
	}
	return false
}

// checkBreaks checks that lease l ended within its TTL after each break.
func (x *exclusionChecker) checkBreaks(l *leaseLife) {
	if l.ttl == 0 || l.end == 0 {
		return // an end not recorded (the run stopped first) is not judged
	}
	for _, b := range x.breaks[l.key] {
		if b.fence != l.fence || b.done < l.ok {
			continue
		}
		// Every renewal sent after the break fails, so the lease runs
		// out by its validity at the latest. (Sooner, at its next
		// renewal, is not promised: a renewal that fails for another
		// reason, a busy SQLite, is tried again.)
		due := b.done + int64(l.ttl+exclusionSlack)
		if l.end > due && !x.stopped(l.worker, b.invoke, due) {
			x.r.OutlivedBreak++
			x.r.problem(due, "worker %d: lease on %s (fence %d) still live %v after a break of it completed (TTL %v)", l.worker, l.key,
				l.fence, time.Duration(l.end-b.done).Round(time.Millisecond), l.ttl)
		}
	}
}

// checkOverlaps checks that no lease of key lived on past another owner's
// grant of it, unless a break, stop or restart explains it.
func (x *exclusionChecker) checkOverlaps(key string, ls []*leaseLife) {
	sort.Slice(ls, func(i, j int) bool { return ls[i].ok < ls[j].ok })
	for i, a := range ls {
		end := a.end
		if end == 0 {
			continue
		}
		for _, b := range ls[i+1:] {
			if b.ok+int64(exclusionSlack) >= end {
				break
			}
			if b.owner == a.owner {
				continue
			}
			excused := x.stopped(a.worker, a.ok, end) || x.restarted(a.ok, b.ok)
			// A break of the key while a lived, or of a's grant itself
			// wherever a's record falls: a's grant was made before
			// the break found it, though a set member is recorded only
			// once AcquireAll returns, which may be after the break of
			// the member it was granted first.
			for _, br := range x.breaks[key] {
				if br.invoke <= b.ok && (br.done >= a.ok || br.of(a)) {
					excused = true
				}
			}
			if !excused {
				x.r.Overlaps++
				x.r.problem(b.ok, "%s: granted to worker %d (fence %d) while worker %d's lease (fence %d) lived on for %v more", key,
					b.worker, b.fence, a.worker, a.fence, time.Duration(end-b.ok).Round(time.Millisecond))
			}
		}
	}
}
