package fenced

import (
	"context"
	"fmt"
	"time"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/core/token"
)

// The methods below are the operator's side of a store. Owner tokens never
// leave them whole: every owner they return is shortened.

// List returns the held leases whose keys start with prefix ("" for all),
// sorted by key.
func (c *Client) List(ctx context.Context, prefix string) ([]LeaseInfo, error) {
	infos, err := c.drv.List(ctx, prefix)
	if err != nil {
		return nil, fmt.Errorf("fenced: list %q: %w", prefix, err)
	}
	for i := range infos {
		infos[i] = shortOwner(infos[i])
	}
	return infos, nil
}

// Break ends the current grant of key, whoever holds it. The holder's
// next renewal fails (its lease context is cancelled with ErrLost), and
// the next grant gets a higher fence. reason is required; by names who
// broke it. Stores with an audit log record the break (see Breaks).
// Break returns what it broke, or an error matching ErrNotHeld when
// nothing was held.
func (c *Client) Break(ctx context.Context, key, reason, by string) (LeaseInfo, error) {
	if err := ValidateKey(key); err != nil {
		return LeaseInfo{}, fmt.Errorf("fenced: break: %w", err)
	}
	if reason == "" {
		return LeaseInfo{}, fmt.Errorf("fenced: break %q: a reason is required", key)
	}
	info, err := c.drv.Break(ctx, key, reason, by)
	if err != nil {
		return shortOwner(info), fmt.Errorf("fenced: break %q: %w", key, err)
	}
	return shortOwner(info), nil
}

// Breaks returns the recorded breaks of key ("" for every key), oldest
// first. Stores without an audit log (Capabilities().BreakLog false)
// return ErrUnsupported.
func (c *Client) Breaks(ctx context.Context, key string) ([]driver.BreakRecord, error) {
	bl := c.ops().BreakLogger
	if bl == nil {
		return nil, fmt.Errorf("fenced: breaks: %w", ErrUnsupported)
	}
	recs, err := bl.Breaks(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("fenced: breaks %q: %w", key, err)
	}
	for i := range recs {
		recs[i].Owner = token.Short(recs[i].Owner)
	}
	return recs, nil
}

// FenceFloor reports the store's fence floor (every grant that starts after
// it was raised gets a fence above it) and the highest fence the store
// records for any key. The larger of the two is the number to seed a new
// store or table with (RaiseFenceFloor there) before moving keys to it, so
// that no resource ever sees a fence go back. Stores without a floor
// (Capabilities().FenceFloor false) return ErrUnsupported.
func (c *Client) FenceFloor(ctx context.Context) (floor, maxFence uint64, err error) {
	ff := c.ops().FenceFloorer
	if ff == nil {
		return 0, 0, fmt.Errorf("fenced: fence floor: %w", ErrUnsupported)
	}
	floor, maxFence, err = ff.FenceFloor(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("fenced: fence floor: %w", err)
	}
	return floor, maxFence, nil
}

// RaiseFenceFloor raises the store's fence floor to floor, if it is lower,
// and returns the floor in force: every grant that starts afterwards, of
// any key, gets a fence above it. A floor is never lowered. Use it when a
// key's counter restarted or is about to (keys moved to another table or
// store, rows deleted by hand) while resources hold fences from before. A
// floor above 2^61 fails with ErrInvalidFloor;
// stores without a floor return ErrUnsupported.
func (c *Client) RaiseFenceFloor(ctx context.Context, floor uint64) (uint64, error) {
	ff := c.ops().FenceFloorer
	if ff == nil {
		return 0, fmt.Errorf("fenced: raise fence floor: %w", ErrUnsupported)
	}
	got, err := ff.RaiseFenceFloor(ctx, floor)
	if err != nil {
		return 0, fmt.Errorf("fenced: raise fence floor to %d: %w", floor, err)
	}
	return got, nil
}

// Prune deletes the stored state of keys that are not held and whose last
// grant ended more than olderThan ago. In the same transaction it raises
// the fence floor to the highest fence it deleted, so a key granted again
// still gets a fence above every one it had. Where a store does not record
// when a grant was released (MySQL, SQLite), a released or broken key is
// old enough for any olderThan. A negative olderThan fails with
// ErrInvalidTTL; stores that keep no per-key state
// (Capabilities().FenceFloor false) return ErrUnsupported. It returns the
// keys deleted and the floor after; on an error, what was done before it.
func (c *Client) Prune(ctx context.Context, olderThan time.Duration) (deleted int64, floor uint64, err error) {
	p := c.ops().FenceFloorer
	if p == nil {
		return 0, 0, fmt.Errorf("fenced: prune: %w", ErrUnsupported)
	}
	deleted, floor, err = p.Prune(ctx, olderThan)
	if err != nil {
		return deleted, floor, fmt.Errorf("fenced: prune older than %v: %w", olderThan, err)
	}
	return deleted, floor, nil
}
