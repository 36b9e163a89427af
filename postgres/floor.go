package postgres

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
	if err := d.checkOpen(); err != nil {
		return driver.FloorInfo{}, err
	}
	var floor, maxFence int64
	if err := d.pool.QueryRow(ctx, d.sql.floor).Scan(&floor, &maxFence); err != nil {
		return driver.FloorInfo{}, classify("fence floor", "", err)
	}
	return driver.FloorInfo{Floor: uint64(floor), MaxFence: uint64(maxFence)}, nil
}

// RaiseFenceFloor implements driver.FenceFloorer in one statement. The
// floor lives in the table TABLE_floor, and every grant reads it (see the
// package documentation).
func (d *Driver) RaiseFenceFloor(ctx context.Context, floor uint64) (uint64, error) {
	if err := d.checkOpen(); err != nil {
		return 0, err
	}
	if err := leasetable.CheckFloor(floor); err != nil {
		return 0, fmt.Errorf("postgres: raise fence floor: %w", err)
	}
	var now int64
	if err := d.pool.QueryRow(ctx, d.sql.raiseFloor, int64(floor)).Scan(&now); err != nil {
		return 0, classify("raise fence floor", "", err)
	}
	return uint64(now), nil
}

// Prune implements driver.Pruner. A row is deleted when its expires_at is
// more than olderThan before the database's now() when the prune starts;
// release and break set expires_at to the time they happened, so a
// released key is kept for olderThan too. Each batch is one statement
// (see the prune statement), so it is atomic without a transaction of its
// own; grants never wait for it except on the rows it deletes.
func (d *Driver) Prune(ctx context.Context, olderThan time.Duration) (driver.PruneResult, error) {
	if err := d.checkOpen(); err != nil {
		return driver.PruneResult{}, err
	}
	if err := leasetable.CheckOlderThan(olderThan); err != nil {
		return driver.PruneResult{}, fmt.Errorf("postgres: %w", err)
	}
	var cutoff time.Time
	if err := d.pool.QueryRow(ctx, d.sql.pruneCutoff, leasetable.Micros(olderThan)).Scan(&cutoff); err != nil {
		return driver.PruneResult{}, classify("prune", "", err)
	}
	res, err := leasetable.PruneInBatches(func(after string) (leasetable.PruneBatch, error) {
		var b leasetable.PruneBatch
		var floor int64
		err := d.pool.QueryRow(ctx, d.sql.prune, after, cutoff, leasetable.PruneBatchSize).Scan(&b.Examined, &b.Last, &b.Deleted, &floor)
		b.Floor = uint64(floor)
		return b, err
	})
	if err != nil {
		return res, classify("prune", "", err)
	}
	return res, nil
}
