package fencedsqlite

import (
	"context"

	"github.com/fenced-dev/fenced/internal/backend/leasetable"
	"github.com/fenced-dev/fenced/internal/backend/sqllease"
)

// pruneBatch is one batch of Prune (driver.FenceFloorer). A row is deleted when its expires_ms is
// more than olderThan before SQLite's clock when the prune starts. Release
// and break set expires_ms to 0 (the table keeps no release time), so a
// released or broken key is deleted whatever olderThan is; that is safe,
// because the floor covers its fence. Each batch is one transaction that
// writes first, so it holds the database's write lock while it reads,
// deletes and raises the floor: no grant can run in between.
func (q queries) pruneBatch(ctx context.Context, db sqllease.DB, cutoff any, after string) (leasetable.PruneBatch, error) {
	var b leasetable.PruneBatch
	err := db.InTx(ctx, func(tx sqllease.Conn) error {
		args := []any{after, cutoff, leasetable.PruneBatchSize}
		var floor int64
		if err := tx.QueryRow(ctx, q.pruneRaise, args...).Scan(&floor); err != nil {
			return err
		}
		b.Floor = uint64(floor)
		if err := tx.QueryRow(ctx, q.pruneCount, args...).Scan(&b.Examined, &b.Last); err != nil {
			return err
		}
		res, err := tx.Exec(ctx, q.pruneDelete, args...)
		b.Deleted = res.RowsAffected
		return err
	})
	if err != nil {
		return leasetable.PruneBatch{}, err
	}
	return b, nil
}
