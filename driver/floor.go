package driver

import (
	"context"
	"time"
)

// FenceFloorer is implemented by drivers whose grants can be made to start
// above a floor. Each grant's fence is one more than the larger of the key's
// own counter and the floor. The same atomic step as the grant decides it.
// It lets an operator move keys to a new store or table. It also lets one
// recover from deleted counters, without reissuing a fence that a resource
// has already seen, and delete the records of keys nobody uses any more
// (Prune) without breaking fence monotonicity.
type FenceFloorer interface {
	// FenceFloor reports the floor (every grant that starts after it was
	// raised gets a fence above it) and the highest fence the store still
	// records for any key (zero when it records none). The larger of the
	// two is above every fence the store has handed out, unless rows were
	// deleted behind its back.
	FenceFloor(ctx context.Context) (floor, maxFence uint64, err error)
	// RaiseFenceFloor raises the floor to floor if it is lower, and returns
	// the floor now in force (never lower than before: a floor is never
	// lowered). Grants that start after it returns get fences above the
	// returned floor; a grant already in flight may still get a lower one.
	// A floor above 2^61 is refused with an error matching
	// fenced.ErrInvalidFloor (it leaves 2^61 grants above the highest
	// floor; MySQL's reply encoding needs fences below 2^62).
	RaiseFenceFloor(ctx context.Context, floor uint64) (uint64, error)
	// Prune deletes the records of keys that are not held and whose last
	// grant ended more than olderThan ago by the authority's clock, and in
	// the same transaction raises the fence floor to the highest fence it
	// deleted. A key granted again later starts above that floor. A prune
	// may work in several transactions (batches); each one is atomic, so
	// stopping it half way loses nothing. A negative olderThan is refused
	// with fenced.ErrInvalidTTL. It returns the number of keys deleted and
	// the floor after the prune: at least the highest fence of every
	// deleted key. On an error, what the batches before it did.
	Prune(ctx context.Context, olderThan time.Duration) (deleted int64, floor uint64, err error)
}
