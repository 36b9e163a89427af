package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
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
	var info driver.FloorInfo
	err := d.db.QueryRowContext(ctx, `SELECT COALESCE((SELECT fence_floor FROM `+d.f+` WHERE id = 1), 0), COALESCE((SELECT MAX(fence) FROM `+d.t+`), 0)`).
		Scan(&info.Floor, &info.MaxFence)
	if err != nil {
		return driver.FloorInfo{}, classify("fence floor", "", err)
	}
	return info, nil
}

// RaiseFenceFloor implements driver.FenceFloorer: the floor lives in the
// table TABLE_floor, and every grant reads it in its one statement (see
// the package documentation).
func (d *Driver) RaiseFenceFloor(ctx context.Context, floor uint64) (uint64, error) {
	if err := d.checkOpen(); err != nil {
		return 0, err
	}
	if err := leasetable.CheckFloor(floor); err != nil {
		return 0, fmt.Errorf("mysql: raise fence floor: %w", err)
	}
	var now uint64
	err := d.inTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, d.raiseFloorSQL(), floor, floor); err != nil {
			return err
		}
		return tx.QueryRowContext(ctx, `SELECT fence_floor FROM `+d.f+` WHERE id = 1`).Scan(&now)
	})
	if err != nil {
		return 0, classify("raise fence floor", "", err)
	}
	return now, nil
}

// raiseFloorSQL raises the floor to its two (equal) parameters, creating
// the floor row if someone deleted it.
func (d *Driver) raiseFloorSQL() string {
	return `INSERT INTO ` + d.f + ` (id, fence_floor) VALUES (1, ?) ON DUPLICATE KEY UPDATE fence_floor = GREATEST(fence_floor, ?)`
}

// inTx runs fn in a transaction and commits it.
func (d *Driver) inTx(ctx context.Context, fn func(*sql.Tx) error) error {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}

// Prune implements driver.Pruner. A row is deleted when its expires_at is
// more than olderThan before the server's UTC_TIMESTAMP when the prune
// starts. Release and break set expires_at to 1970 (the table keeps no
// release time), so a released or broken key is deleted whatever
// olderThan is; that is safe, because the floor covers its fence.
//
// Each batch is one transaction that locks the floor row first (so grants,
// which read it with a shared lock, wait for the batch instead of
// inserting a deleted key again below the new floor), then locks its
// candidate rows by primary key and checks them again under the lock, and
// deletes them and raises the floor together. Candidates are found by a
// plain read before the transaction, so grants wait for a few hundred
// primary-key operations, never for a table scan.
func (d *Driver) Prune(ctx context.Context, olderThan time.Duration) (driver.PruneResult, error) {
	if err := d.checkOpen(); err != nil {
		return driver.PruneResult{}, err
	}
	if err := leasetable.CheckOlderThan(olderThan); err != nil {
		return driver.PruneResult{}, fmt.Errorf("mysql: %w", err)
	}
	// The cutoff travels as text, so neither the pool's time zone nor its
	// parseTime setting can shift it.
	var cutoff string
	if err := d.db.QueryRowContext(ctx, `SELECT CAST(UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND AS CHAR)`, leasetable.Micros(olderThan)).Scan(&cutoff); err != nil {
		return driver.PruneResult{}, classify("prune", "", err)
	}
	res, err := leasetable.PruneInBatches(ctx, func(after string) (leasetable.PruneBatch, error) {
		return d.pruneBatch(ctx, cutoff, after)
	})
	if err != nil {
		return res, classify("prune", "", err)
	}
	if res.Deleted == 0 {
		info, err := d.FenceFloor(ctx)
		res.Floor = info.Floor
		return res, err
	}
	return res, nil
}

func (d *Driver) pruneBatch(ctx context.Context, cutoff, after string) (leasetable.PruneBatch, error) {
	var b leasetable.PruneBatch
	rows, err := d.db.QueryContext(ctx, `SELECT lease_key FROM `+d.t+` WHERE lease_key > ? AND expires_at < CAST(? AS DATETIME(6))
 ORDER BY lease_key LIMIT ?`, []byte(after), cutoff, leasetable.PruneBatchSize)
	if err != nil {
		return b, err
	}
	var keys []any
	for rows.Next() {
		var k []byte
		if err := rows.Scan(&k); err != nil {
			rows.Close()
			return b, err
		}
		keys = append(keys, k)
		b.Last = string(k)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return b, err
	}
	b.Examined = len(keys)
	err = d.inTx(ctx, func(tx *sql.Tx) error {
		err := tx.QueryRowContext(ctx, `SELECT fence_floor FROM `+d.f+` WHERE id = 1 FOR UPDATE`).Scan(&b.Floor)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		if len(keys) == 0 {
			return nil
		}
		in := strings.TrimSuffix(strings.Repeat("?, ", len(keys)), ", ")
		locked, err := tx.QueryContext(ctx, `SELECT lease_key, fence FROM `+d.t+` WHERE lease_key IN (`+in+`) AND expires_at < CAST(? AS DATETIME(6)) FOR UPDATE`,
			append(keys, cutoff)...)
		if err != nil {
			return err
		}
		var victims []any
		var highest uint64
		for locked.Next() {
			var k []byte
			var fence uint64
			if err := locked.Scan(&k, &fence); err != nil {
				locked.Close()
				return err
			}
			victims = append(victims, k)
			highest = max(highest, fence)
		}
		locked.Close()
		if err := locked.Err(); err != nil {
			return err
		}
		if len(victims) == 0 {
			return nil
		}
		in = strings.TrimSuffix(strings.Repeat("?, ", len(victims)), ", ")
		res, err := tx.ExecContext(ctx, `DELETE FROM `+d.t+` WHERE lease_key IN (`+in+`)`, victims...)
		if err != nil {
			return err
		}
		if b.Deleted, err = res.RowsAffected(); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, d.raiseFloorSQL(), highest, highest); err != nil {
			return err
		}
		b.Floor = max(b.Floor, highest)
		return nil
	})
	if err != nil {
		return leasetable.PruneBatch{}, err
	}
	return b, nil
}
