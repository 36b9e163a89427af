package fencedpostgres

import (
	"context"
	"database/sql"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenced-dev/fenced/internal/backend/leasetable"
	"github.com/fenced-dev/fenced/internal/backend/sqllease"
)

// pgxQuerier is what pgxpool.Pool and pgx.Tx have in common.
type pgxQuerier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// pgxConn is the lease-table engine's Conn over pgx.
type pgxConn struct{ q pgxQuerier }

func (c pgxConn) Exec(ctx context.Context, query string, args ...any) (sqllease.Result, error) {
	tag, err := c.q.Exec(ctx, query, args...)
	return sqllease.Result{RowsAffected: tag.RowsAffected()}, err
}

func (c pgxConn) QueryRow(ctx context.Context, query string, args ...any) leasetable.Scanner {
	return noRows{c.q.QueryRow(ctx, query, args...)}
}

func (c pgxConn) Query(ctx context.Context, query string, args ...any) (sqllease.Rows, error) {
	rows, err := c.q.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return pgxRows{rows}, nil
}

// noRows reports pgx.ErrNoRows as sql.ErrNoRows, as the engine expects.
type noRows struct{ pgx.Row }

func (r noRows) Scan(dest ...any) error {
	err := r.Row.Scan(dest...)
	if errors.Is(err, pgx.ErrNoRows) {
		return sql.ErrNoRows
	}
	return err
}

type pgxRows struct{ pgx.Rows }

func (r pgxRows) Close() { r.Rows.Close() }

// pgxDB is the lease-table engine's DB over a pool.
type pgxDB struct {
	pgxConn
	pool     *pgxpool.Pool
	owns     bool      // the driver opened the pool
	listener *listener // stopped first in Close
}

func (d *pgxDB) InTx(ctx context.Context, fn func(sqllease.Conn) error) error {
	return pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error { return fn(pgxConn{tx}) })
}

func (d *pgxDB) Close() error {
	if d.listener != nil {
		d.listener.close()
	}
	if d.owns {
		d.pool.Close()
	}
	return nil
}
