// Package pgxfence lets the SQL guard of package fence run on native pgx
// connections and transactions, without database/sql:
//
//	guard, _ := fence.NewSQL(stdlib.OpenDBFromPool(pool), fence.Postgres, table, nil) // for EnsureColumns and Check
//	tx, _ := pool.Begin(ctx)
//	res, err := guard.ClaimConn(ctx, pgxfence.Conn(tx), jobID, fence.From(lease))
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

// Conn adapts q to fence.Conn.
func Conn(q Querier) fence.Conn { return conn{q} }

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

type row struct{ r pgx.Row }

// Scan maps pgx.ErrNoRows to sql.ErrNoRows, as fence.Row requires.
func (r row) Scan(dest ...any) error {
	err := r.r.Scan(dest...)
	if errors.Is(err, pgx.ErrNoRows) && !errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("%w (%v)", sql.ErrNoRows, err)
	}
	return err
}
