package admin

import (
	"context"
	"fmt"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
)

// FloorInfo describes a store's fence floor; see FenceFloor.
type FloorInfo = driver.FloorInfo

// PruneResult is what Prune did.
type PruneResult = driver.PruneResult

// MaxFenceFloor is the highest fence floor a store accepts.
const MaxFenceFloor = driver.MaxFenceFloor

// ErrInvalidFloor means a fence floor was above MaxFenceFloor.
var ErrInvalidFloor = driver.ErrInvalidFloor

// FenceFloor reports the store's fence floor (every grant that starts after
// it was raised gets a fence above it) and the highest fence the store
// records for any key. The larger of the two is the number to seed a new
// store or table with (RaiseFenceFloor there) before moving keys to it, so
// that no resource ever sees a fence go back. Stores without a floor (all
// but the SQL ones and mem) return ErrUnsupported.
func FenceFloor(ctx context.Context, c *fenced.Client) (FloorInfo, error) {
	ff := driver.CapabilitiesOf(c.Driver()).FenceFloorer
	if ff == nil {
		return FloorInfo{}, fmt.Errorf("fenced: fence floor: %w", fenced.ErrUnsupported)
	}
	info, err := ff.FenceFloor(ctx)
	if err != nil {
		return FloorInfo{}, fmt.Errorf("fenced: fence floor: %w", err)
	}
	return info, nil
}

// RaiseFenceFloor raises the store's fence floor to floor, if it is lower,
// and returns the floor in force: every grant that starts afterwards, of
// any key, old or new, gets a fence above it. A floor is never lowered.
// Use it when a key's counter restarted or is about to (keys moved to
// another table or store, lease rows deleted by hand) while resources hold
// fences from before. A floor above MaxFenceFloor fails with
// ErrInvalidFloor; stores without a floor return ErrUnsupported.
func RaiseFenceFloor(ctx context.Context, c *fenced.Client, floor uint64) (uint64, error) {
	ff := driver.CapabilitiesOf(c.Driver()).FenceFloorer
	if ff == nil {
		return 0, fmt.Errorf("fenced: raise fence floor: %w", fenced.ErrUnsupported)
	}
	got, err := ff.RaiseFenceFloor(ctx, floor)
	if err != nil {
		return 0, fmt.Errorf("fenced: raise fence floor to %d: %w", floor, err)
	}
	return got, nil
}

// Prune deletes the stored state of keys that are not held and whose last
// grant ended more than olderThan ago. In the same transaction it raises the
// fence floor to the highest fence it deleted. So a key granted again later
// still gets a fence above every one it had. Lease tables otherwise keep one
// row per key for ever. Where a store does not record when a grant was
// released (MySQL, SQLite), a released or broken key is old enough for any
// olderThan. A negative olderThan fails with driver.ErrInvalidTTL; stores
// that keep no per-key state to prune return ErrUnsupported.
func Prune(ctx context.Context, c *fenced.Client, olderThan time.Duration) (PruneResult, error) {
	p := driver.CapabilitiesOf(c.Driver()).Pruner
	if p == nil {
		return PruneResult{}, fmt.Errorf("fenced: prune: %w", fenced.ErrUnsupported)
	}
	res, err := p.Prune(ctx, olderThan)
	if err != nil {
		return res, fmt.Errorf("fenced: prune older than %v: %w", olderThan, err)
	}
	return res, nil
}
