package fencedmysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/fenced-dev/fenced/internal/backend/leasetable"
	"github.com/fenced-dev/fenced/internal/backend/sqllease"
)

// raiseFloor raises the floor in the table TABLE_floor, which every grant
// reads in its one statement (see the package documentation).
func (d *Driver) raiseFloor(ctx context.Context, db sqllease.DB, floor uint64) (uint64, error) {
	var now uint64
	err := db.InTx(ctx, func(tx sqllease.Conn) error {
		if _, err := tx.Exec(ctx, d.raiseFloorSQL(), floor, floor); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT fence_floor FROM `+d.f+` WHERE id = 1`).Scan(&now)
	})
	return now, err
}

// raiseFloorSQL raises the floor to its two (equal) parameters, creating
// the floor row if someone deleted it.
func (d *Driver) raiseFloorSQL() string {
	return `INSERT INTO ` + d.f + ` (id, fence_floor) VALUES (1, ?) ON DUPLICATE KEY UPDATE fence_floor = GREATEST(fence_floor, ?)`
}

// pruneBatch is one batch of Prune (driver.FenceFloorer). A row is deleted when its expires_at is
// more than olderThan before the server's UTC_TIMESTAMP when the prune
// starts. Release and break set expires_at to 1970 (the table keeps no
// release time), so a released or broken key is deleted whatever
// olderThan is; that is safe, because the floor covers its fence.
//
// Each batch is one transaction. It locks the floor row first. Grants read
// that row with a shared lock, so they wait for the batch instead of
// inserting a deleted key again below the new floor. It then locks its
// candidate rows by primary key and checks them again under the lock. It
// deletes them and raises the floor together. Candidates are found by a
// plain read before the transaction, so grants wait for a few hundred
// primary-key operations, never for a table scan.
func (d *Driver) pruneBatch(ctx context.Context, db sqllease.DB, cutoffValue any, after string) (leasetable.PruneBatch, error) {
	cutoff := fmt.Sprintf("%s", cutoffValue)
	var b leasetable.PruneBatch
	rows, err := db.Query(ctx, `SELECT lease_key FROM `+d.t+` WHERE lease_key > ? AND expires_at < CAST(? AS DATETIME(6))
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
	err = db.InTx(ctx, func(tx sqllease.Conn) error {
		err := tx.QueryRow(ctx, `SELECT fence_floor FROM `+d.f+` WHERE id = 1 FOR UPDATE`).Scan(&b.Floor)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		if len(keys) == 0 {
			return nil
		}
		in := strings.TrimSuffix(strings.Repeat("?, ", len(keys)), ", ")
		locked, err := tx.Query(ctx,
			`SELECT lease_key, fence FROM `+d.t+` WHERE lease_key IN (`+in+`) AND expires_at < CAST(? AS DATETIME(6)) FOR UPDATE`,
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
		res, err := tx.Exec(ctx, `DELETE FROM `+d.t+` WHERE lease_key IN (`+in+`)`, victims...)
		if err != nil {
			return err
		}
		b.Deleted = res.RowsAffected
		if _, err := tx.Exec(ctx, d.raiseFloorSQL(), highest, highest); err != nil {
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
