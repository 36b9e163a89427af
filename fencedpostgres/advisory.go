package fencedpostgres

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenced-dev/fenced"
)

// TxBeginner starts transactions; *pgxpool.Pool and *pgx.Conn implement it.
type TxBeginner interface {
	BeginTx(ctx context.Context, txOptions pgx.TxOptions) (pgx.Tx, error)
}

// AdvisoryOptions configure WithAdvisoryLock. The zero value (or nil)
// skips when the lock is taken.
type AdvisoryOptions struct {
	// Wait makes WithAdvisoryLock wait for the lock instead of skipping.
	// The wait happens inside PostgreSQL's lock manager, which queues
	// waiters and wakes the next one when the holder's transaction ends: no
	// polling.
	Wait bool
	// MaxWait bounds the wait (zero: until ctx ends). It is enforced with
	// SET LOCAL lock_timeout, so it also bounds every other lock wait of
	// the transaction; fn may SET LOCAL lock_timeout again.
	MaxWait time.Duration
	// TxOptions are the options of the transaction fn runs in.
	TxOptions pgx.TxOptions
}

// AdvisoryKey maps a key to the 64-bit advisory lock id WithAdvisoryLock
// uses: the first 8 bytes of the key's SHA-256, big-endian, as a signed
// integer. Other languages compute the same id the same way (for example
// int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big",
// signed=True) in Python), unlike PostgreSQL's hashtext, which is not
// guaranteed stable across versions. Distinct keys can collide (2^-64 per
// pair): a collision only makes two keys exclude each other.
func AdvisoryKey(key string) int64 {
	sum := sha256.Sum256([]byte(key))
	return int64(binary.BigEndian.Uint64(sum[:8]))
}

// WithAdvisoryLock runs fn in a transaction that holds the transaction-
// scoped advisory lock of key (pg_try_advisory_xact_lock, or
// pg_advisory_xact_lock when opts.Wait is set). This is the "let the
// database be the lock" pattern. The lock and fn's writes share one
// transaction, so they commit or roll back together. A crashed or
// disconnected worker loses the lock at the moment its writes are rolled
// back. When the work writes only to this database, that is all the
// protection it needs.
//
// If the lock is taken and opts.Wait is false, fn is not called and the
// error matches fenced.ErrHeld. If opts.MaxWait runs out, the error also
// matches ErrHeld. fn's error is returned unchanged after the transaction
// is rolled back. Otherwise the transaction is committed and a commit
// failure is returned. Passing a pgx.Tx's connection while that
// transaction is open is not supported (the lock would outlive fn).
//
// What it does not give:
//
//   - No fencing token. The lock has no generation number, so it cannot
//     protect a resource outside this transaction: once fn calls another
//     system (an HTTP API, another database), a worker that lost its
//     connection may still be talking to that system after another
//     worker took the lock. Use the lease table (fenced.Open with a
//     postgres:// URL) and its fence for that.
//   - No TTL. The lock lasts exactly as long as the transaction; a
//     transaction that hangs holds it until PostgreSQL notices the dead
//     connection (tcp keepalives) or a timeout ends it
//     (idle_in_transaction_session_timeout, statement_timeout).
//
// Why only the transaction-scoped form: a session-scoped lock
// (pg_advisory_lock) belongs to the server connection and is held until
// unlocked or the session ends. Behind a transaction-mode pooler
// (PgBouncer), consecutive statements of one client run on whichever server
// connection is free. So the session that took the lock is not the one that
// later unlocks it. Unlock fails, or releases another client's lock. The
// lock is left held by a server connection the pooler hands to other
// clients. Even a plain pool can return the connection with the lock still
// held. A transaction is always pinned to one server connection, so the
// transaction-scoped form is safe everywhere.
func WithAdvisoryLock(ctx context.Context, db TxBeginner, key string, opts *AdvisoryOptions,
	fn func(ctx context.Context, tx pgx.Tx) error) error {
	var o AdvisoryOptions
	if opts != nil {
		o = *opts
	}
	if o.MaxWait < 0 {
		return fmt.Errorf("postgres: advisory lock %q: %w: MaxWait %v is negative", key, fenced.ErrInvalidTTL, o.MaxWait)
	}
	tx, err := db.BeginTx(ctx, o.TxOptions)
	if err != nil {
		return classify("advisory lock begin", key, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	id := AdvisoryKey(key)
	if o.Wait {
		if o.MaxWait > 0 {
			ms := max(o.MaxWait.Milliseconds(), 1)
			if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", ms)); err != nil {
				return classify("advisory lock", key, err)
			}
		}
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, id); err != nil {
			if isLockTimeout(err) {
				return fmt.Errorf("postgres: advisory lock %q: gave up after waiting %v: %w", key, o.MaxWait, &fenced.HeldError{})
			}
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			return classify("advisory lock", key, err)
		}
		if o.MaxWait > 0 {
			if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = DEFAULT"); err != nil {
				return classify("advisory lock", key, err)
			}
		}
	} else {
		var got bool
		if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, id).Scan(&got); err != nil {
			return classify("advisory lock", key, err)
		}
		if !got {
			return fmt.Errorf("postgres: advisory lock: %w", &fenced.HeldError{})
		}
	}
	if err := fn(ctx, tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return classify("advisory lock commit", key, err)
	}
	return nil
}

func isLockTimeout(err error) bool {
	var pgErr interface{ SQLState() string }
	return errors.As(err, &pgErr) && pgErr.SQLState() == "55P03"
}
