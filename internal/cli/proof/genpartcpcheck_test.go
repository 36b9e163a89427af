package proof

import (
	"slices"
	"strings"
	"testing"
)

// TestCheckGenPartitionsCheckpoints feeds the checkpoint checks small
// histories of one partition: a hand-over that carries the last accepted
// checkpoint (fine, also when the last try's outcome is unknown), a stale
// checkpoint accepted, and a new owner that starts from an older one or
// from nothing.
func TestCheckGenPartitionsCheckpoints(t *testing.T) {
	try := func(pid int, fence uint64, v string, start int64, res string) []partEvent {
		evs := []partEvent{{K: "cptry", T: start, PID: pid, Member: "m", P: 4, Part: 1, Fence: fence, CP: v}}
		if res != "" {
			evs = append(evs, partEvent{K: "cp", T: start + 1, PID: pid, Member: "m", P: 4, Part: 1, Fence: fence, CP: v, Res: res})
		}
		return evs
	}
	own := func(pid int, fence uint64, from string, t int64) partEvent {
		return partEvent{K: "own", T: t, PID: pid, Member: "m", P: 4, Part: 1, Fence: fence, CP: from}
	}
	first := slices.Concat([]partEvent{own(1, 5, "", 10)}, try(1, 5, "5:0", 20, "ok"), try(1, 5, "5:4", 30, "ok"))
	cases := []struct {
		name    string
		evs     []partEvent
		problem string
		stale   int
		breaks  int
	}{
		{"carried", slices.Concat(first, []partEvent{own(2, 7, "5:4", 100)}), "", 0, 0},
		{"carried, last outcome unknown", slices.Concat(first, try(1, 5, "5:8", 40, ""), []partEvent{own(2, 7, "5:8", 100)}), "", 0, 0},
		{"stale refused", slices.Concat(first, []partEvent{own(2, 7, "5:4", 100)}, try(1, 5, "5:8", 150, "refused")), "", 0, 0},
		{"stale accepted", slices.Concat(first, []partEvent{own(2, 7, "5:4", 100)}, try(1, 5, "5:8", 150, "ok")),
			"stale checkpoint accepted", 1, 0},
		{"older one", slices.Concat(first, []partEvent{own(2, 7, "5:0", 100)}), "the last accepted before it is \"5:4\"", 0, 1},
		{"nothing", slices.Concat(first, []partEvent{own(2, 7, "", 100)}), "started from no checkpoint", 0, 1},
		{"a refused one", slices.Concat(first, try(1, 5, "5:8", 40, "refused"), []partEvent{own(2, 7, "5:8", 100)}),
			"which no earlier grant recorded", 0, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rep := CheckGenPartitions(tc.evs, nil, 64)
			if rep.StaleCheckpoints != tc.stale || rep.CheckpointBreaks != tc.breaks {
				t.Errorf("stale %d, breaks %d; want %d, %d (%v)", rep.StaleCheckpoints, rep.CheckpointBreaks, tc.stale, tc.breaks, rep.Problems)
			}
			switch {
			case tc.problem == "" && rep.Failed():
				t.Errorf("problems %v, want none", rep.Problems)
			case tc.problem != "" && (!rep.Failed() || !strings.Contains(rep.Problems[0], tc.problem)):
				t.Errorf("problems %v, want one saying %q", rep.Problems, tc.problem)
			}
		})
	}
}
