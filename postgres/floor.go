package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

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

// pruneLockTimeout bounds how long a prune batch waits for the lease
// table: grants and renewals queue behind a waiting prune, so it must not
// wait long behind a transaction that holds the table (a break whose
// client stopped half way, for example).
const pruneLockTimeout = 500 * time.Millisecond

// lockNotAvailable is the SQLSTATE of a lock_timeout.
const lockNotAvailable = "55P03"

// pruneLockTries is how many times a batch tries to lock the table
// before the prune gives up with ErrUnavailable.
const pruneLockTries = 5

// Prune implements driver.Pruner. A row is deleted when its expires_at is
// more than olderThan before the database's now() when the prune starts;
// release and break set expires_at to the time they happened, so a
// released key is kept for olderThan too.
//
// Each batch is one transaction that first locks the lease table in SHARE
// ROW EXCLUSIVE mode, which waits for every statement writing the table
// (grants, renewals, releases) to finish and holds new ones back until
// the batch commits: a grant reads the floor in its statement's snapshot,
// so it must not run across a batch (see the acquire statement). The wait
// for the lock is bounded (pruneLockTimeout, then tried again a few
// times), and a batch holds it for a few hundred primary-key deletions.
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
	res, err := leasetable.PruneInBatches(ctx, func(after string) (leasetable.PruneBatch, error) {
		for try := 1; ; try++ {
			b, err := d.pruneBatch(ctx, cutoff, after)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != lockNotAvailable {
				return b, err
			}
			if try == pruneLockTries {
				return b, fmt.Errorf("%w: the lease table stayed locked by another transaction for %d tries of %v: %w", driver.ErrUnavailable, try, pruneLockTimeout, err)
			}
			select {
			case <-ctx.Done():
				return b, ctx.Err()
			case <-time.After(time.Duration(try) * pruneLockTimeout):
			}
		}
	})
	if err != nil {
		return res, classify("prune", "", err)
	}
	return res, nil
}

func (d *Driver) pruneBatch(ctx context.Context, cutoff time.Time, after string) (leasetable.PruneBatch, error) {
	var b leasetable.PruneBatch
	err := pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", pruneLockTimeout.Milliseconds())); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, d.sql.lockForPrune); err != nil {
			return err
		}
		var floor int64
		err := tx.QueryRow(ctx, d.sql.prune, after, cutoff, leasetable.PruneBatchSize).Scan(&b.Examined, &b.Last, &b.Deleted, &floor)
		b.Floor = uint64(floor)
		return err
	})
	return b, err
}
