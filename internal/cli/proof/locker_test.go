package proof

import (
	"testing"

	"github.com/fenced-dev/fenced"
)

// lockerHistory is two holders of a fenceless lock on key k: a (granted
// first) and b (granted after a's lease ran out while a was paused). Both
// read length 0; the resource accepted their appends in the order given.
func lockerHistory(order ...string) ([]Event, Contents) {
	ev := func(t int64, w int, k Kind, op int64, owner string, mod func(*Event)) Event {
		e := Event{T: t, Worker: w, Kind: k, Op: op, Key: "k", Owner: owner}
		if mod != nil {
			mod(&e)
		}
		return e
	}
	prev := func(e *Event) { e.Prev, e.Value = 0, 1 }
	events := []Event{
		ev(10, 0, AcquireInvoke, 1, "", nil),
		ev(11, 0, AcquireOK, 1, "a", nil),
		ev(12, 0, ReadInvoke, 2, "a", nil),
		ev(13, 0, ReadOK, 2, "a", nil),
		ev(20, 1, AcquireInvoke, 3, "", nil),
		ev(30, 1, AcquireOK, 3, "b", nil),
		ev(31, 1, ReadInvoke, 4, "b", nil),
		ev(32, 1, ReadOK, 4, "b", nil),
	}
	res := Contents{Invoices: map[string]map[int64]int{"k": {}}, Claims: map[int64]uint64{}}
	t := int64(40)
	for i, who := range order {
		w, op := 0, int64(5)
		if who == "b" {
			w, op = 1, 6
		}
		events = append(events, ev(t, w, WriteInvoke, op, who, prev), ev(t+1, w, WriteOK, op, who, func(e *Event) { e.Value = 1 }))
		res.Ledger = append(res.Ledger, LedgerRow{Seq: int64(i + 1), Op: op, Key: "k", N: 1, Owner: who, Worker: w})
		res.Invoices["k"][1]++
		t += 10
	}
	return events, res
}

func TestCheckerJudgesFencelessLockByGrantOrder(t *testing.T) {
	t.Run("successor only", func(t *testing.T) {
		// a abandoned; b wrote: no hazard, although both grants carry
		// fence 0 from different owners.
		events, res := lockerHistory("b")
		rep := Check(events, res, fenced.FenceNone)
		if rep.StaleAccepted != 0 || rep.DuplicateEffects != 0 || !rep.Linearizable || rep.HazardSeen {
			t.Fatalf("clean succession judged a hazard: %+v", rep)
		}
	})
	t.Run("stale write after successor", func(t *testing.T) {
		events, res := lockerHistory("b", "a")
		rep := Check(events, res, fenced.FenceNone)
		if rep.StaleAttempted != 1 || rep.StaleAccepted != 1 || rep.DuplicateEffects != 1 || rep.Linearizable || !rep.HazardSeen {
			t.Fatalf("stale write by the earlier holder not seen: %+v", rep)
		}
	})
}
