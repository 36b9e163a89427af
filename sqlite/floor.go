package sqlite

import (
	"context"
	"fmt"
	"time"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/leasetable"
)

var (
	_ driver.FenceFloorer = (*Driver)(nil)
	_ driver.Pruner       = (*Driver)(nil)
)

// FenceFloor implements driver.FenceFloorer. MaxFence reads the whole
// lease table.
func (d *Driver) FenceFloor(ctx context.Context) (driver.FloorInfo, error) {
	var floor, maxFence int64
	if err := d.db.QueryRowContext(ctx, d.q.floor).Scan(&floor, &maxFence); err != nil {
		return driver.FloorInfo{}, classify(err)
	}
	return driver.FloorInfo{Floor: uint64(floor), MaxFence: uint64(maxFence)}, nil
}

// RaiseFenceFloor implements driver.FenceFloorer in one statement. The
// floor lives in the table TABLE_floor, and every grant reads it (see the
// package documentation).
func (d *Driver) RaiseFenceFloor(ctx context.Context, floor uint64) (uint64, error) {
	if err := leasetable.CheckFloor(floor); err != nil {
		return 0, fmt.Errorf("sqlite: raise fence floor: %w", err)
	}
	var now int64
	if err := d.db.QueryRowContext(ctx, d.q.raiseFloor, int64(floor)).Scan(&now); err != nil {
		return 0, classify(err)
	}
	return uint64(now), nil
}

// Prune implements driver.Pruner. A row is deleted when its expires_ms is
// more than olderThan before SQLite's clock when the prune starts. Release
// and break set expires_ms to 0 (the table keeps no release time), so a
// released or broken key is deleted whatever olderThan is; that is safe,
// because the floor covers its fence. Each batch is one transaction that
// writes first, so it holds the database's write lock while it reads,
// deletes and raises the floor: no grant can run in between.
func (d *Driver) Prune(ctx context.Context, olderThan time.Duration) (driver.PruneResult, error) {
	if err := leasetable.CheckOlderThan(olderThan); err != nil {
		return driver.PruneResult{}, fmt.Errorf("sqlite: %w", err)
	}
	var cutoff int64
	if err := d.db.QueryRowContext(ctx, d.q.pruneCutoff, olderThan.Milliseconds()).Scan(&cutoff); err != nil {
		return driver.PruneResult{}, classify(err)
	}
	res, err := leasetable.PruneInBatches(ctx, func(after string) (leasetable.PruneBatch, error) {
		return d.pruneBatch(ctx, cutoff, after)
	})
	return res, classify(err)
}

func (d *Driver) pruneBatch(ctx context.Context, cutoff int64, after string) (leasetable.PruneBatch, error) {
	var b leasetable.PruneBatch
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return b, err
	}
	defer tx.Rollback()
	args := []any{after, cutoff, leasetable.PruneBatchSize}
	var floor int64
	if err := tx.QueryRowContext(ctx, d.q.pruneRaise, args...).Scan(&floor); err != nil {
		return b, err
	}
	if err := tx.QueryRowContext(ctx, d.q.pruneCount, args...).Scan(&b.Examined, &b.Last); err != nil {
		return b, err
	}
	res, err := tx.ExecContext(ctx, d.q.pruneDelete, args...)
	if err != nil {
		return b, err
	}
	if b.Deleted, err = res.RowsAffected(); err != nil {
		return b, err
	}
	if err := tx.Commit(); err != nil {
		return leasetable.PruneBatch{}, err
	}
	b.Floor = uint64(floor)
	return b, nil
}
