// Package pgxfence lets the SQL guard of package fence run on native pgx
// connections and transactions, without database/sql. The guard itself is
// built over a database/sql handle of the same pool (for EnsureColumns and
// Check):
//
//	guard, _ := fence.NewSQL(stdlib.OpenDBFromPool(pool), fence.Postgres, table, nil)
//	guard.EnsureColumns(ctx)
//	var status string
//	claim, err := pgxfence.ClaimAndRead(ctx, guard, pool, jobID, fence.From(lease),
//		func(ctx context.Context, tx pgx.Tx) error {
//			return tx.QueryRow(ctx, `SELECT status FROM jobs WHERE id = $1`, jobID).Scan(&status)
//		})
//	// … the work, outside any transaction …
//	res, err := guard.UpdateConn(ctx, pgxfence.Conn(pool), jobID, fence.From(lease), fence.Write{…})
package pgxfence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fenced-dev/fenced/fence"
)

// Querier is what pgx.Tx, *pgx.Conn and *pgxpool.Pool have in common.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Beginner starts transactions: *pgxpool.Pool, *pgx.Conn and pgx.Tx (a
// savepoint) qualify.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Conn adapts q to fence.Conn.
func Conn(q Querier) fence.Conn { return conn{q} }

// ClaimAndRead is fence.SQL.ClaimAndRead on pgx. It begins a transaction on
// db and claims the row identified by key for t in it. It calls read (if not
// nil) with that transaction, to read the state the holder inherits, and
// commits. A Stale result or an error rolls it back. The guard's Timeout
// bounds the whole and sets PostgreSQL's transaction-local lock, statement
// and idle timeouts. See fence.SQL for the safe sequence.
func ClaimAndRead(ctx context.Context, g *fence.SQL, db Beginner, key any, t fence.Token,
	read func(ctx context.Context, tx pgx.Tx) error) (fence.Result, error) {
	if g == nil || db == nil {
		return fence.Result{}, errors.New("pgxfence: ClaimAndRead needs a guard and a Beginner")
	}
	var tx pgx.Tx
	begin := func(ctx context.Context) (fence.TxConn, error) {
		var err error
		if tx, err = db.Begin(ctx); err != nil {
			return nil, err
		}
		return txConn{conn{tx}, tx}, nil
	}
	var readInTx func(context.Context) error
	if read != nil {
		readInTx = func(ctx context.Context) error { return read(ctx, tx) }
	}
	return g.ClaimAndReadConn(ctx, begin, key, t, readInTx)
}

type conn struct{ q Querier }

func (c conn) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	tag, err := c.q.Exec(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

func (c conn) QueryRow(ctx context.Context, query string, args ...any) fence.Row {
	return row{c.q.QueryRow(ctx, query, args...)}
}

// txConn is a pgx transaction as a fence.TxConn.
type txConn struct {
	conn
	tx pgx.Tx
}

func (t txConn) Commit(ctx context.Context) error   { return t.tx.Commit(ctx) }
func (t txConn) Rollback(ctx context.Context) error { return t.tx.Rollback(ctx) }

type row struct{ r pgx.Row }

// Scan maps pgx.ErrNoRows to sql.ErrNoRows, as fence.Row requires.
func (r row) Scan(dest ...any) error {
	err := r.r.Scan(dest...)
	if errors.Is(err, pgx.ErrNoRows) && !errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("%w (%v)", sql.ErrNoRows, err)
	}
	return err
}
