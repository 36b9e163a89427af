package main

import (
	"context"
	"testing"
	"time"
)

// chanLocker is a lock of this process: a one-slot channel per key.
type chanLocker struct{ slot chan struct{} }

func (l chanLocker) lock(ctx context.Context, _ string) (func(context.Context) error, error) {
	select {
	case l.slot <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return func(context.Context) error { <-l.slot; return nil }, nil
}

// TestHandoverRoundPairsReleaseWithNextGrant: each sample is from one
// holder's release to the next grant, so with a lock that hands over in
// microseconds no sample comes near the settle time a holder waits
// before releasing (a sample paired with the wrong release would).
func TestHandoverRoundPairsReleaseWithNextGrant(t *testing.T) {
	slot := make(chan struct{}, 1)
	var ls []locker
	for range 4 {
		ls = append(ls, chanLocker{slot})
	}
	var marks []bool
	lat, err := handoverRound(context.Background(), ls, "k", 6, func(last bool) { marks = append(marks, last) })
	if err != nil {
		t.Fatal(err)
	}
	if len(marks) != 2 || marks[0] || !marks[1] {
		t.Errorf("marks %v, want [false true]: the first grant, then the last measured", marks)
	}
	if len(lat) != 6 {
		t.Fatalf("got %d samples, want 6", len(lat))
	}
	for i, d := range lat {
		if d < 0 || d >= settle/2 {
			t.Errorf("sample %d = %v, want in [0, %v)", i, d, settle/2)
		}
	}
}

// TestTimedLockFallsBackToLocalStamps: a locker that tells no times of
// its own is stamped here, grant before release.
func TestTimedLockFallsBackToLocalStamps(t *testing.T) {
	before := time.Now()
	at, unlock, err := timedLock(context.Background(), chanLocker{make(chan struct{}, 1)}, "k")
	if err != nil {
		t.Fatal(err)
	}
	rel, err := unlock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if at.Before(before) || rel.Before(at) {
		t.Fatalf("granted %v, releasing %v, after %v: out of order", at, rel, before)
	}
}
