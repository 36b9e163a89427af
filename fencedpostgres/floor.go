package fencedpostgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/backend/leasetable"
	"github.com/fenced-dev/fenced/internal/backend/sqllease"
)

// pruneLockTimeout bounds how long a prune batch waits for the lease table.
// Grants and renewals queue behind a waiting prune. So it must not wait long
// behind a transaction that holds the table, such as a break whose client
// stopped half way.
const pruneLockTimeout = 500 * time.Millisecond

// lockNotAvailable is the SQLSTATE of a lock_timeout.
const lockNotAvailable = "55P03"

// pruneLockTries is how many times a batch tries to lock the table
// before the prune gives up with ErrUnavailable.
const pruneLockTries = 5

// pruneBatch is one batch of Prune (driver.FenceFloorer), retried while the
// table stays locked. A row is deleted when its expires_at is
// more than olderThan before the database's now() when the prune starts;
// release and break set expires_at to the time they happened, so a
// released key is kept for olderThan too.
//
// Each batch is one transaction. It first locks the lease table in SHARE ROW
// EXCLUSIVE mode. That waits for every statement writing the table (grants,
// renewals, releases) to finish, and holds new ones back until the batch
// commits. A grant reads the floor in its statement's snapshot, so it must
// not run across a batch (see the acquire statement). The wait for the lock
// is bounded (pruneLockTimeout, then tried again a few times), and a batch
// holds it for a few hundred primary-key deletions.
func (q statements) pruneBatch(ctx context.Context, db sqllease.DB, cutoff any, after string) (leasetable.PruneBatch, error) {
	for try := 1; ; try++ {
		b, err := pruneOnce(ctx, db, q, cutoff, after)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != lockNotAvailable {
			return b, err
		}
		if try == pruneLockTries {
			return b, fmt.Errorf("%w: the lease table stayed locked by another transaction for %d tries of %v: %w",
				fenced.ErrUnavailable, try, pruneLockTimeout, err)
		}
		select {
		case <-ctx.Done():
			return b, ctx.Err()
		case <-time.After(time.Duration(try) * pruneLockTimeout):
		}
	}
}

func pruneOnce(ctx context.Context, db sqllease.DB, q statements, cutoff any, after string) (leasetable.PruneBatch, error) {
	var b leasetable.PruneBatch
	err := db.InTx(ctx, func(tx sqllease.Conn) error {
		if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", pruneLockTimeout.Milliseconds())); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, q.lockForPrune); err != nil {
			return err
		}
		var floor int64
		err := tx.QueryRow(ctx, q.prune, after, cutoff, leasetable.PruneBatchSize).Scan(&b.Examined, &b.Last, &b.Deleted, &floor)
		b.Floor = uint64(floor)
		return err
	})
	return b, err
}
