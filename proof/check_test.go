package proof

import (
	"testing"

	"github.com/fenced-dev/fenced"
)

// TestCheckCountsRepeatOfWaitingAcquire: B's acquire was invoked (and
// waited) before A's grant was confirmed, and was granted A's fence after
// a failover. The real-time order of the two grants is not known from the
// invocations, but one fence granted to two owners is a repeat in any
// order: a repeat on a backend that declares it, a regression on a strict
// one.
func TestCheckCountsRepeatOfWaitingAcquire(t *testing.T) {
	events := []Event{
		{Kind: AcquireInvoke, T: 1, Op: 1, Worker: 0, Key: "k"},
		{Kind: AcquireInvoke, T: 2, Op: 2, Worker: 1, Key: "k"},
		{Kind: AcquireOK, T: 5, Op: 1, Worker: 0, Key: "k", Fence: 7, Owner: "a"},
		{Kind: AcquireOK, T: 10, Op: 2, Worker: 1, Key: "k", Fence: 7, Owner: "b"},
		{Kind: AcquireInvoke, T: 11, Op: 3, Worker: 2, Key: "k"},
		{Kind: AcquireOK, T: 12, Op: 3, Worker: 2, Key: "k", Fence: 8, Owner: "c"},
	}
	if r := Check(append([]Event(nil), events...), Contents{}, fenced.FenceRepeatable); r.FenceRepeats != 1 || r.FenceRegressions != 0 {
		t.Errorf("repeatable fence: %d repeats, %d regressions; want 1, 0", r.FenceRepeats, r.FenceRegressions)
	}
	if r := Check(append([]Event(nil), events...), Contents{}, fenced.FenceStrict); r.FenceRegressions != 1 {
		t.Errorf("strict fence: %d regressions; want 1 (the repeat)", r.FenceRegressions)
	}
}
