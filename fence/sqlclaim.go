package fence

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"time"
)

// TxConn is a Conn inside a transaction that the guard commits or rolls
// back (ClaimAndReadConn).
type TxConn interface {
	Conn
	// Commit commits the transaction.
	Commit(ctx context.Context) error
	// Rollback rolls it back; after Commit it must do nothing harmful.
	Rollback(ctx context.Context) error
}

// sqlTx adapts a *sql.Tx to TxConn.
type sqlTx struct {
	sqlConn
	tx *sql.Tx
}

func (t sqlTx) Commit(context.Context) error   { return t.tx.Commit() }
func (t sqlTx) Rollback(context.Context) error { return t.tx.Rollback() }

// ClaimAndRead is the first step of the safe sequence (see SQL). In one
// short transaction of its own, it claims the row identified by key for t.
// Then it calls read, if not nil, in the same transaction, to read the state
// the holder inherits, and commits. Do the work after it returns, outside
// any transaction, then write with Update and a nil Querier.
//
// Because the claim comes first, read sees the row after every write an
// older holder made. Every older holder's write that arrives later is
// refused. The state read is the state to continue from. read must only read
// (and may write rows the claim protects). It runs with the guard's Timeout
// as a deadline on the whole transaction, which also sets the database's own
// limits (see SQLOptions.Timeout). So a holder paused inside it cannot keep
// the row locked: its transaction is ended and the claim rolled back.
//
// The result is Applied (read ran and the claim committed) or Stale (a
// newer holder has claimed or written the row; read did not run, nothing
// was committed). Errors leave nothing committed; they match the same
// sentinels as Claim's, or are read's own error, wrapped. An error from the
// commit itself may hide a committed claim. Claiming again with the same
// token is harmless.
func (g *SQL) ClaimAndRead(ctx context.Context, key any, t Token, read func(ctx context.Context, tx *sql.Tx) error) (Result, error) {
	if err := g.validateToken(key, t); err != nil {
		return Result{}, fmt.Errorf("fence: claim %s: %w", g.table.Name, err)
	}
	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	conn, err := g.db.Conn(ctx)
	if err != nil {
		return Result{}, fmt.Errorf("fence: claim %s: %w", g.table.Name, err)
	}
	defer conn.Close()
	if err := g.ready(ctx, sqlConn{conn}); err != nil {
		return Result{}, fmt.Errorf("fence: claim %s: %w", g.table.Name, err)
	}
	restore, err := g.sessionTimeouts(ctx, conn)
	if err != nil {
		return Result{}, fmt.Errorf("fence: claim %s: set timeouts: %w", g.table.Name, err)
	}
	defer restore()
	var tx *sql.Tx
	begin := func(ctx context.Context) (TxConn, error) {
		var err error
		if tx, err = conn.BeginTx(ctx, nil); err != nil {
			return nil, err
		}
		return sqlTx{sqlConn{tx}, tx}, nil
	}
	var readInTx func(context.Context) error
	if read != nil {
		readInTx = func(ctx context.Context) error { return read(ctx, tx) }
	}
	return g.claimAndRead(ctx, begin, key, t, readInTx)
}

// ClaimAndReadConn is ClaimAndRead on a connection that is not a
// database/sql one. begin starts a transaction (fence/pgxfence.ClaimAndRead
// does it for pgx). In it the guard claims the row, calls read and commits.
// It rolls back on a Stale result or an error. The guard's Timeout is a
// deadline on the whole. On PostgreSQL the guard also sets transaction-local
// lock, statement and idle timeouts. Session-level limits (MySQL, SQLite)
// are the caller's to set on such a connection.
//
// If the table's shape has not been checked yet, the check runs inside the
// transaction, before the claim.
func (g *SQL) ClaimAndReadConn(ctx context.Context, begin func(ctx context.Context) (TxConn, error), key any, t Token,
	read func(ctx context.Context) error) (Result, error) {
	if begin == nil {
		return Result{}, fmt.Errorf("fence: claim %s: begin is nil", g.table.Name)
	}
	if err := g.validateToken(key, t); err != nil {
		return Result{}, fmt.Errorf("fence: claim %s: %w", g.table.Name, err)
	}
	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	return g.claimAndRead(ctx, begin, key, t, read)
}

// claimAndRead runs the claim transaction: begin, transaction-local
// timeouts, shape check if still needed, claim, read, commit.
func (g *SQL) claimAndRead(ctx context.Context, begin func(ctx context.Context) (TxConn, error), key any, t Token,
	read func(ctx context.Context) error) (Result, error) {
	tx, err := begin(ctx)
	if err != nil {
		return Result{}, fmt.Errorf("fence: claim %s: begin: %w", g.table.Name, err)
	}
	committed := false
	defer func() {
		if !committed {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			tx.Rollback(rctx)
		}
	}()
	if g.dialect == Postgres {
		ms := fmt.Sprint(g.timeout.Milliseconds())
		if _, err := tx.Exec(ctx,
			`SELECT set_config('lock_timeout', $1, true), set_config('statement_timeout', $1, true),
 set_config('idle_in_transaction_session_timeout', $1, true)`, ms); err != nil {
			return Result{}, fmt.Errorf("fence: claim %s: set timeouts: %w", g.table.Name, err)
		}
	}
	if err := g.ready(ctx, tx); err != nil {
		return Result{}, fmt.Errorf("fence: claim %s: %w", g.table.Name, err)
	}
	res, err := g.write(ctx, "claim", tx, false, key, t, Write{})
	if err != nil || !res.Applied() {
		return res, err
	}
	if read != nil {
		if err := read(ctx); err != nil {
			return Result{}, fmt.Errorf("fence: claim %s: read in the claim's transaction: %w", g.table.Name, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return Result{}, fmt.Errorf(
			"fence: claim %s: commit (the claim may have been applied; claiming again with the same token is harmless): %w",
			g.table.Name, err)
	}
	committed = true
	return res, nil
}

// sessionTimeouts sets the guard's timeout as the session's lock wait and
// idle limits on conn, where the database has no transaction-local form
// (MySQL, SQLite), unless the session's own limit is already lower. The
// returned function restores the session's values; if that fails the
// connection is discarded rather than returned to the pool with them.
func (g *SQL) sessionTimeouts(ctx context.Context, conn *sql.Conn) (restore func(), err error) {
	noop := func() {}
	undo := func(query string) func() {
		return func() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if _, err := conn.ExecContext(rctx, query); err != nil {
				conn.Raw(func(any) error { return driver.ErrBadConn })
			}
		}
	}
	switch g.dialect {
	case MySQL:
		secs := int64((g.timeout + time.Second - 1) / time.Second)
		_, err := conn.ExecContext(ctx, `SET @fenced_lock_wait = @@SESSION.innodb_lock_wait_timeout, @fenced_wait = @@SESSION.wait_timeout,
 SESSION innodb_lock_wait_timeout = LEAST(@@SESSION.innodb_lock_wait_timeout, ?),
 SESSION wait_timeout = LEAST(@@SESSION.wait_timeout, ?)`, secs, secs)
		if err != nil {
			return noop, err
		}
		return undo(`SET SESSION innodb_lock_wait_timeout = @fenced_lock_wait, SESSION wait_timeout = @fenced_wait`), nil
	case SQLite:
		var prev int64
		if err := conn.QueryRowContext(ctx, `PRAGMA busy_timeout`).Scan(&prev); err != nil {
			return noop, err
		}
		ms := g.timeout.Milliseconds()
		if prev > 0 && prev <= ms {
			return noop, nil
		}
		if _, err := conn.ExecContext(ctx, fmt.Sprintf(`PRAGMA busy_timeout = %d`, ms)); err != nil {
			return noop, err
		}
		return undo(fmt.Sprintf(`PRAGMA busy_timeout = %d`, prev)), nil
	}
	return noop, nil
}
