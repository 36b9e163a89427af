package leasetable

import (
	"context"
	"fmt"
	"github.com/fenced-dev/fenced/internal/core/limits"
	"time"

	"github.com/fenced-dev/fenced"
)

// CheckFloor refuses a fence floor above limits.MaxFenceFloor, with an
// error matching fenced.ErrInvalidFloor.
func CheckFloor(floor uint64) error {
	if floor > limits.MaxFenceFloor {
		return fmt.Errorf("%w: %d is above the highest floor, %d", fenced.ErrInvalidFloor, floor, limits.MaxFenceFloor)
	}
	return nil
}

// CheckOlderThan refuses a negative prune age, with an error matching
// fenced.ErrInvalidTTL.
func CheckOlderThan(olderThan time.Duration) error {
	if olderThan < 0 {
		return fmt.Errorf("%w: prune older than %v: the age is negative", fenced.ErrInvalidTTL, olderThan)
	}
	return nil
}

// PruneBatchSize bounds the rows one prune transaction examines. Grants
// wait for that transaction (MySQL) or for its write lock (SQLite). So they
// are held up for milliseconds, not for the time a whole table takes.
const PruneBatchSize = 500

// PruneBatch is what one prune transaction did.
type PruneBatch struct {
	// Examined is the number of candidate rows the batch looked at, in
	// key order; fewer than PruneBatchSize means it reached the end.
	Examined int
	// Deleted is the number of rows it deleted (a candidate taken by a
	// grant in the meantime is kept).
	Deleted int64
	// Last is the last candidate key examined; the next batch starts
	// after it.
	Last string
	// Floor is the fence floor after the batch.
	Floor uint64
}

// PruneInBatches runs batch until a batch examines fewer than
// PruneBatchSize rows, and sums what they did. Each call is one transaction
// over the candidate rows after the key it is given ("" at first). Between
// batches it waits as long as the last batch took (at least a millisecond).
// So a prune of a large table holds the locks grants and renewals need at
// most half of the time. SQLite's busy handler, for one, gives no waiter
// priority over a writer that comes straight back. It stops at the first
// error or when ctx ends; the batches before are committed and safe.
func PruneInBatches(ctx context.Context, batch func(after string) (PruneBatch, error)) (deleted int64, floor uint64, err error) {
	after := ""
	for {
		start := time.Now()
		b, err := batch(after)
		if err != nil {
			return deleted, floor, err
		}
		deleted += b.Deleted
		floor = max(floor, b.Floor)
		if b.Examined < PruneBatchSize {
			return deleted, floor, nil
		}
		after = b.Last
		t := time.NewTimer(max(time.Since(start), time.Millisecond))
		select {
		case <-ctx.Done():
			t.Stop()
			return deleted, floor, ctx.Err()
		case <-t.C:
		}
	}
}
