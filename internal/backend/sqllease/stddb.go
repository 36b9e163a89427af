package sqllease

import (
	"context"
	"database/sql"

	"github.com/fenced-dev/fenced/internal/backend/leasetable"
)

// StdDB is the DB of a database/sql pool (MySQL, SQLite, and any store
// with a database/sql driver). Statements given to Prepare run as prepared
// statements; the others as they are.
type StdDB struct {
	db    *sql.DB
	owns  bool
	stmts map[string]*sql.Stmt
}

// NewStdDB returns the DB of db; Close closes db only when owns is set.
func NewStdDB(db *sql.DB, owns bool) *StdDB {
	return &StdDB{db: db, owns: owns, stmts: map[string]*sql.Stmt{}}
}

// Prepare prepares the hot statements of a dialect. It must be called
// before the DB is used concurrently. On error nothing stays prepared.
func (s *StdDB) Prepare(ctx context.Context, queries ...string) error {
	for _, q := range queries {
		st, err := s.db.PrepareContext(ctx, q)
		if err != nil {
			s.closeStmts()
			s.stmts = map[string]*sql.Stmt{}
			return err
		}
		s.stmts[q] = st
	}
	return nil
}

// SetOwned makes Close close the pool too (for a driver opened by URL).
func (s *StdDB) SetOwned() { s.owns = true }

// Pool returns the *sql.DB.
func (s *StdDB) Pool() *sql.DB { return s.db }

type stdConn interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// txConn runs statements in a transaction.
type txConn struct{ tx *sql.Tx }

func exec(ctx context.Context, c stdConn, query string, args []any) (Result, error) {
	res, err := c.ExecContext(ctx, query, args...)
	if err != nil {
		return Result{}, err
	}
	var r Result
	if r.RowsAffected, err = res.RowsAffected(); err != nil {
		return r, err
	}
	r.LastInsertID, _ = res.LastInsertId()
	return r, nil
}

type stdRows struct{ *sql.Rows }

func (r stdRows) Close() { r.Rows.Close() }

func query(ctx context.Context, c stdConn, q string, args []any) (Rows, error) {
	rows, err := c.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	return stdRows{rows}, nil
}

// conn returns the prepared statement of query, or the pool.
func (s *StdDB) conn(query string) stdConn {
	if st, ok := s.stmts[query]; ok {
		return stmtConn{st}
	}
	return s.db
}

// stmtConn runs one prepared statement, ignoring the query text.
type stmtConn struct{ st *sql.Stmt }

func (c stmtConn) ExecContext(ctx context.Context, _ string, args ...any) (sql.Result, error) {
	return c.st.ExecContext(ctx, args...)
}

func (c stmtConn) QueryRowContext(ctx context.Context, _ string, args ...any) *sql.Row {
	return c.st.QueryRowContext(ctx, args...)
}

func (c stmtConn) QueryContext(ctx context.Context, _ string, args ...any) (*sql.Rows, error) {
	return c.st.QueryContext(ctx, args...)
}

// Exec implements Conn.
func (s *StdDB) Exec(ctx context.Context, q string, args ...any) (Result, error) {
	return exec(ctx, s.conn(q), q, args)
}

// QueryRow implements Conn.
func (s *StdDB) QueryRow(ctx context.Context, q string, args ...any) leasetable.Scanner {
	return s.conn(q).QueryRowContext(ctx, q, args...)
}

// Query implements Conn.
func (s *StdDB) Query(ctx context.Context, q string, args ...any) (Rows, error) {
	return query(ctx, s.conn(q), q, args)
}

// InTx implements DB.
func (s *StdDB) InTx(ctx context.Context, fn func(Conn) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := fn(txConn{tx}); err != nil {
		return err
	}
	return tx.Commit()
}

func (t txConn) Exec(ctx context.Context, q string, args ...any) (Result, error) {
	return exec(ctx, t.tx, q, args)
}

func (t txConn) QueryRow(ctx context.Context, q string, args ...any) leasetable.Scanner {
	return t.tx.QueryRowContext(ctx, q, args...)
}

func (t txConn) Query(ctx context.Context, q string, args ...any) (Rows, error) {
	return query(ctx, t.tx, q, args)
}

// closeStmts closes every prepared statement. It leaves the map as it
// is: Close may run while a call the client gave up on still uses a
// statement (sql.Stmt is safe for that; the call gets an error), and the
// map is only read once Prepare has returned.
func (s *StdDB) closeStmts() {
	for _, st := range s.stmts {
		st.Close()
	}
}

// Close implements DB.
func (s *StdDB) Close() error {
	s.closeStmts()
	if s.owns {
		return s.db.Close()
	}
	return nil
}
