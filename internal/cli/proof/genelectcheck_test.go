package proof

import (
	"strings"
	"testing"
	"time"
)

// TestCheckGenElectJudges feeds the checker small histories: two work
// contexts live at once (the hazard), terms in turn (fine), client-go's
// context outliving a stop (reported, not failed) and outliving nothing
// (failed), a stale write accepted, and a leader too late after a kill.
func TestCheckGenElectJudges(t *testing.T) {
	const ms = int64(time.Millisecond)
	tm := ElectTiming{LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 500 * time.Millisecond}
	// term returns the samples of a term of pid with fence f: work
	// context live over [w0, w1], client-go's over [c0, c1] (ms).
	term := func(pid int, f uint64, w0, w1, c0, c1 int64) []electEvent {
		evs := []electEvent{{K: "lead", T: min(w0, c0) * ms, PID: pid, Fence: f, TTL: 3 * time.Second}}
		for at := min(w0, c0); at <= max(w1, c1)+10; at += 10 {
			evs = append(evs, electEvent{K: "s", TB: at * ms, T: at*ms + 1, PID: pid, Fence: f, W: at >= w0 && at <= w1, CG: at >= c0 && at <= c1})
		}
		return evs
	}
	cat := func(parts ...[]electEvent) []electEvent {
		var out []electEvent
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	t.Run("two leaders", func(t *testing.T) {
		rep := CheckGenElect(cat(term(1, 1, 100, 5000, 100, 5000), term(2, 2, 4000, 9000, 4000, 9000)), nil, tm)
		if rep.Overlaps != 1 || rep.CGOverlaps != 1 || !rep.Failed() || !strings.Contains(rep.Problems[0], "two leaders at once") {
			t.Fatalf("two work contexts live at once: %+v", rep)
		}
	})
	t.Run("in turn", func(t *testing.T) {
		rep := CheckGenElect(cat(term(1, 1, 100, 3000, 100, 3000), term(2, 2, 3020, 9000, 3020, 9000)), nil, tm)
		if rep.Failed() || rep.Terms != 2 {
			t.Fatalf("terms in turn: %+v", rep)
		}
	})
	t.Run("stop", func(t *testing.T) {
		// pid 1 stopped at 1s, continued at 6s: its work context reads
		// ended at once, client-go's lives 2s more.
		stop := electEvent{K: "fault", Fault: "stop", T: 1000 * ms, End: 6000 * ms, PID: 1, Fence: 1, Hurt: true}
		evs := cat(term(1, 1, 100, 990, 100, 8000), term(2, 2, 4500, 12000, 4500, 12000), []electEvent{stop})
		rep := CheckGenElect(evs, nil, tm)
		if rep.Failed() || rep.CGPauseOverlaps != 1 || rep.MaxCGAfterResume < 2*time.Second || rep.Recoveries != 1 {
			t.Fatalf("client-go's context after a stop: %+v", rep)
		}
		// The same with the work context under client-go's alone: an
		// overlap.
		evs = cat(term(1, 1, 100, 8000, 100, 8000), term(2, 2, 4500, 12000, 4500, 12000), []electEvent{stop})
		if rep := CheckGenElect(evs, nil, tm); rep.Overlaps != 1 || !rep.Failed() {
			t.Fatalf("the work context after a stop: %+v", rep)
		}
	})
	t.Run("stale write", func(t *testing.T) {
		ws := []partWrite{{Seq: 1, PID: 1, Fence: 1, T: 100}, {Seq: 2, PID: 2, Fence: 2, T: 200}, {Seq: 3, PID: 1, Fence: 1, T: 300}}
		if rep := CheckGenElect(nil, ws, tm); rep.StaleAccepted != 1 || !rep.Failed() {
			t.Fatalf("fence 1 accepted after fence 2: %+v", rep)
		}
	})
	t.Run("late leader", func(t *testing.T) {
		kill := electEvent{K: "fault", Fault: "kill", T: 1000 * ms, End: 1001 * ms, PID: 1, Fence: 1, Hurt: true}
		// Bound: the 3s keep + 1.1s campaign + 20ms of samples.
		evs := cat(term(1, 1, 100, 990, 100, 990), term(2, 2, 6000, 7000, 6000, 7000), []electEvent{kill})
		if rep := CheckGenElect(evs, nil, tm); !rep.Failed() || !strings.Contains(rep.Problems[0], "no leader for") {
			t.Fatalf("a leader 5s after a kill: %+v", rep)
		}
		evs = cat(term(1, 1, 100, 990, 100, 990), term(2, 2, 4000, 7000, 4000, 7000), []electEvent{kill})
		if rep := CheckGenElect(evs, nil, tm); rep.Failed() {
			t.Fatalf("a leader 3s after a kill: %+v", rep)
		}
	})
}
