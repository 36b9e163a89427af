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

// TestCheckRollbackOnRepeatableFence: after an asynchronous failover the
// counter rolls back two grants, so the next grant reissues fence 7, lower
// than the 8 confirmed before it. On a backend that declares repeatable
// fences that is the declared repeat (with the first holder of 7), not a
// regression; on a strict backend it is both a regression and a repeat.
// A lower fence never granted before is a regression on either.
func TestCheckRollbackOnRepeatableFence(t *testing.T) {
	events := []Event{
		{Kind: AcquireInvoke, T: 1, Op: 1, Worker: 0, Key: "k"},
		{Kind: AcquireOK, T: 2, Op: 1, Worker: 0, Key: "k", Fence: 7, Owner: "g"},
		{Kind: AcquireInvoke, T: 3, Op: 2, Worker: 1, Key: "k"},
		{Kind: AcquireOK, T: 4, Op: 2, Worker: 1, Key: "k", Fence: 8, Owner: "a"},
		{Kind: AcquireInvoke, T: 5, Op: 3, Worker: 2, Key: "k"},
		{Kind: AcquireOK, T: 6, Op: 3, Worker: 2, Key: "k", Fence: 7, Owner: "b"},
	}
	if r := Check(append([]Event(nil), events...), Contents{}, fenced.FenceRepeatable); r.FenceRepeats != 1 || r.FenceRegressions != 0 {
		t.Errorf("repeatable fence, 7 reissued after 8: %d repeats, %d regressions; want 1, 0", r.FenceRepeats, r.FenceRegressions)
	}
	if r := Check(append([]Event(nil), events...), Contents{}, fenced.FenceStrict); r.FenceRegressions != 2 {
		t.Errorf("strict fence, 7 reissued after 8: %d regressions; want 2 (lower than 8, and 7 twice)", r.FenceRegressions)
	}
	events[5].Fence = 6 // never granted before
	if r := Check(append([]Event(nil), events...), Contents{}, fenced.FenceRepeatable); r.FenceRegressions != 2 {
		t.Errorf("repeatable fence, 6 after 7 and 8: %d regressions; want 2", r.FenceRegressions)
	}
}
