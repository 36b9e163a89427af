package proof

import (
	"strings"
	"testing"
)

// TestCheckGenPartitionsJudges feeds the checker small histories: two
// counts holding partitions that share an item at once (the hazard), the
// same hand-over done in turn (fine), and a stale write accepted.
func TestCheckGenPartitionsJudges(t *testing.T) {
	const items = 64
	// An item routed to partition a of 4 and b of 8.
	item := 0
	a, b := itemPartition(item, 4), itemPartition(item, 8)
	own := func(pid, p, part int, fence uint64, start, live int64) []partEvent {
		return []partEvent{
			{K: "own", T: start, PID: pid, Member: "m", P: p, Part: part, Fence: fence},
			{K: "end", T: live + 1, PID: pid, Member: "m", P: p, Part: part, Fence: fence, Live: live},
		}
	}
	t.Run("overlap", func(t *testing.T) {
		evs := append(own(1, 4, a, 3, 100, 500), own(2, 8, b, 1, 400, 900)...)
		rep := CheckGenPartitions(evs, nil, items)
		if rep.Overlaps != 1 || !rep.Failed() || !strings.Contains(rep.Problems[0], "worked by two members at once") {
			t.Fatalf("two counts owning item %d at once: %+v", item, rep)
		}
	})
	t.Run("in turn", func(t *testing.T) {
		evs := append(own(1, 4, a, 3, 100, 500), own(2, 8, b, 1, 501, 900)...)
		// Partitions of one count that share no item may overlap.
		evs = append(evs, own(3, 8, (b+1)%8, 2, 100, 900)...)
		if rep := CheckGenPartitions(evs, nil, items); rep.Failed() {
			t.Fatalf("a hand-over in turn: %v", rep.Problems)
		}
	})
	t.Run("stale write", func(t *testing.T) {
		ws := []partWrite{
			{Seq: 1, PID: 1, Part: a, P: 4, Item: item, Fence: 3, T: 100, Live: true},
			{Seq: 2, PID: 2, Part: a, P: 4, Item: item, Fence: 4, T: 200, Live: true},
			{Seq: 3, PID: 1, Part: a, P: 4, Item: item, Fence: 3, T: 300},
		}
		rep := CheckGenPartitions(nil, ws, items)
		if rep.StaleAccepted != 1 || !rep.Failed() || rep.LateItemWrites != 1 {
			t.Fatalf("fence 3 accepted after fence 4: %+v", rep)
		}
	})
}
