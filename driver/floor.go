package driver

import (
	"context"
	"time"
)

// MaxFenceFloor is the highest fence floor a FenceFloorer accepts. It
// leaves 2^61 grants above the highest floor on every store. MySQL's reply
// encoding needs fences below 2^62; every SQL column holds 2^63−1.
const MaxFenceFloor uint64 = 1 << 61

// FloorInfo describes a store's fence floor.
type FloorInfo struct {
	// Floor is the store's fence floor: every grant that starts after the
	// floor was raised gets a fence above it.
	Floor uint64
	// MaxFence is the highest fence the store still records for any key
	// (zero when it records none). The larger of Floor and MaxFence is
	// above every fence the store has handed out, unless rows were deleted
	// behind its back: it is the number to seed another store's floor
	// with when moving keys there.
	MaxFence uint64
}

// FenceFloorer is implemented by drivers whose grants can be made to start
// above a floor. Each grant's fence is one more than the larger of the key's
// own counter and the floor. The same atomic step as the grant decides it.
// It lets an operator move keys to a new store or table. It also lets one
// recover from deleted counters, without reissuing a fence that a resource
// has already seen, and delete the records of keys nobody uses any more
// (Prune) without breaking fence monotonicity.
type FenceFloorer interface {
	// FenceFloor reports the floor and the highest fence the store records.
	FenceFloor(ctx context.Context) (FloorInfo, error)
	// RaiseFenceFloor raises the floor to floor if it is lower, and returns
	// the floor now in force (never lower than before: a floor is never
	// lowered). Grants that start after it returns get fences above the
	// returned floor; a grant already in flight may still get a lower one.
	// A floor above MaxFenceFloor is refused with an error matching
	// fenced.ErrInvalidFloor.
	RaiseFenceFloor(ctx context.Context, floor uint64) (uint64, error)
	// Prune deletes the records of keys that are not held and whose last
	// grant ended more than olderThan ago by the authority's clock, and in
	// the same transaction raises the fence floor to the highest fence it
	// deleted. A key granted again later starts above that floor. A prune
	// may work in several transactions (batches); each one is atomic, so
	// stopping it half way loses nothing. A negative olderThan is refused
	// with fenced.ErrInvalidTTL.
	Prune(ctx context.Context, olderThan time.Duration) (PruneResult, error)
}

// PruneResult is what a prune did.
type PruneResult struct {
	// Deleted is the number of keys whose rows were deleted.
	Deleted int64
	// Floor is the fence floor after the prune: at least the highest fence
	// of every deleted key, so a later grant of any of them gets a fence
	// above the ones it had.
	Floor uint64
}
