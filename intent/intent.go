// Package intent makes side effects that no fence can reach (a payment
// provider, a mail server, a device) happen at most once, with durable
// intent, a stable idempotency key and reconciliation.
//
// A fence stops a paused lease holder from writing to a resource that checks
// fences; a payment provider does not. A scheduler whose lease expires while
// its call to the provider is in flight cannot recall the call, and the next
// holder, acting on a legitimate new lease, would pay again. Three things
// prevent that, and this package provides them over a SQL table:
//
//  1. A stable idempotency key, derived once from the intent's id, stored
//     with the intent and sent on every attempt, so the provider returns the
//     original result for a repeat instead of acting twice.
//  2. Durable intent: the state moves pending → submitting before the call
//     and submitting → submitted (or failed) after it, each transition
//     guarded by the holder's fence (package fence), so a later attempt
//     knows a call may already be in flight and a stale holder cannot
//     overwrite a newer holder's record.
//  3. Reconciliation: a Reconciler finds intents stuck in submitting for
//     longer than a bound and asks the provider, by idempotency key, what
//     happened, resolving them without a second side effect.
//
// The lease still helps: it keeps concurrent attempts rare. It is just not
// what prevents the double payout.
//
// A worker's attempt, with lease a lease on the intent's key:
//
//	it, err := store.Begin(ctx, id, fence.From(lease))   // pending|submitting → submitting
//	if errors.Is(err, intent.ErrResolved) { return nil }  // already submitted or failed
//	ref, err := provider.Pay(ctx, it.IdempotencyKey, it.Payload)
//	if err != nil { return err }                          // stays submitting: retried or reconciled
//	return store.Complete(ctx, id, fence.From(lease), ref) // submitting → submitted
package intent

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fence"
	"github.com/fenced-dev/fenced/internal/sqlident"
)

// State is an intent's place in its life cycle.
type State string

// The states. Pending and Submitting may move on; Submitted and Failed are
// final.
const (
	// Pending: recorded, not yet attempted (or a reconciliation found that
	// the provider never received it).
	Pending State = "pending"
	// Submitting: an attempt may be in flight; its outcome is unknown.
	Submitting State = "submitting"
	// Submitted: the provider accepted it; Ref holds its reference.
	Submitted State = "submitted"
	// Failed: the provider definitively rejected it; Reason says why.
	Failed State = "failed"
)

// Errors, matched with errors.Is. Stale holders get fenced.ErrStaleFence.
var (
	// ErrResolved means the intent is already submitted or failed: there is
	// nothing left to do. Begin returns it with the intent.
	ErrResolved = errors.New("intent: already resolved")
	// ErrNotSubmitting means Complete or Fail was called on an intent that
	// is not in the submitting state.
	ErrNotSubmitting = errors.New("intent: not submitting")
	// ErrNotFound means no intent has the id.
	ErrNotFound = errors.New("intent: not found")
	// ErrConflict means Create found an intent with the same id but a
	// different payload.
	ErrConflict = errors.New("intent: id exists with a different payload")
)

// Intent is one side effect to be performed at most once.
type Intent struct {
	ID string
	// IdempotencyKey is derived once from ID when the intent is created and
	// stored with it; send it on every attempt.
	IdempotencyKey string
	State          State
	// Payload describes the side effect (for example a JSON request body).
	Payload string
	// Ref is the provider's reference, once Submitted.
	Ref string
	// Reason explains a Failed intent.
	Reason string
	// Attempts counts transitions into Submitting.
	Attempts int
	// Fence is the fence of the newest holder that touched the intent.
	Fence uint64
	// Updated is when the intent last changed state, by the database's clock.
	Updated time.Time
}

// DefaultTable is the intent table's default name.
const DefaultTable = "fenced_intents"

// Options configure a Store. nil gives the defaults.
type Options struct {
	// Table is the intent table; default DefaultTable.
	Table string
	// Namespace prefixes derived idempotency keys and separates intents of
	// different kinds that might share ids; default "fenced".
	Namespace string
	// Hooks receive StaleWrite events for transitions refused as stale.
	Hooks fenced.Hooks
}

// Store keeps intents in a SQL table. It is safe for concurrent use.
type Store struct {
	db        *sql.DB
	d         fence.Dialect
	table     string
	namespace string
	guard     *fence.SQL
	now       string // SQL expression: milliseconds since the epoch, database clock
}

// New returns a Store over db. Call EnsureTable once at start-up. opts may
// be nil.
func New(db *sql.DB, d fence.Dialect, opts *Options) (*Store, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Table == "" {
		o.Table = DefaultTable
	}
	if o.Namespace == "" {
		o.Namespace = "fenced"
	}
	if err := sqlident.Check("intent table", o.Table); err != nil {
		return nil, fmt.Errorf("intent: %w", err)
	}
	if strings.ContainsAny(o.Namespace, " \t\r\n") || len(o.Namespace) > 64 {
		return nil, fmt.Errorf("intent: namespace %q must be at most 64 bytes without spaces", o.Namespace)
	}
	g, err := fence.NewSQL(db, d, fence.Table{Name: o.Table, Key: "id"}, &fence.SQLOptions{Hooks: o.Hooks})
	if err != nil {
		return nil, fmt.Errorf("intent: %w", err)
	}
	s := &Store{db: db, d: d, table: o.Table, namespace: o.Namespace, guard: g}
	switch d {
	case fence.SQLite:
		s.now = "CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)"
	case fence.Postgres:
		s.now = "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::bigint"
	case fence.MySQL:
		s.now = "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)"
	}
	return s, nil
}

// Guard returns the fence guard over the intent table, for callers that
// want to claim an intent inside their own transaction.
func (s *Store) Guard() *fence.SQL { return s.guard }

func (s *Store) ph(n int) string {
	if s.d == fence.Postgres {
		return fmt.Sprintf("$%d", n)
	}
	return "?"
}

// EnsureTable creates the intent table if it does not exist, and gives it
// the guard's columns (fence.SQL.EnsureColumns) it lacks.
func (s *Store) EnsureTable(ctx context.Context) error {
	text, idType, long := "TEXT", "TEXT", "TEXT"
	if s.d == fence.MySQL {
		idType, text, long = "VARCHAR(255)", "VARCHAR(1024)", "MEDIUMTEXT"
	}
	q := fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
  id %s PRIMARY KEY,
  idempotency_key %s NOT NULL UNIQUE,
  state VARCHAR(16) NOT NULL CHECK (state IN ('pending', 'submitting', 'submitted', 'failed')),
  payload %s NOT NULL,
  ref %s NOT NULL DEFAULT '',
  reason %s NOT NULL DEFAULT '',
  attempts INTEGER NOT NULL DEFAULT 0,
  created_ms BIGINT NOT NULL,
  updated_ms BIGINT NOT NULL,
  fence BIGINT NOT NULL DEFAULT 0 CHECK (fence >= 0),
  fence_owner VARCHAR(%d) NOT NULL DEFAULT ''
)`, s.table, idType, idType, long, text, text, fence.MaxOwnerLen)
	if _, err := s.db.ExecContext(ctx, q); err != nil {
		return fmt.Errorf("intent: create table %s: %w", s.table, err)
	}
	return s.guard.EnsureColumns(ctx)
}

// DeriveKey returns the idempotency key of intent id in namespace: the
// namespace, a dash and 32 hex digits of SHA-256. It is deterministic, so a
// retried Create derives the same key, and short enough for every provider
// limit we know of.
func DeriveKey(namespace, id string) string {
	sum := sha256.Sum256([]byte(namespace + "\x00" + id))
	return namespace + "-" + hex.EncodeToString(sum[:16])
}

// Create records a pending intent with its idempotency key, or returns the
// existing intent when id was created before with the same payload
// (created = false). An id created with a different payload is an error
// matching ErrConflict; nothing is changed.
func (s *Store) Create(ctx context.Context, id, payload string) (it Intent, created bool, err error) {
	if id == "" || len(id) > 255 {
		return Intent{}, false, fmt.Errorf("intent: create: id must be 1..255 bytes, got %d", len(id))
	}
	key := DeriveKey(s.namespace, id)
	ins := "INSERT INTO %s (id, idempotency_key, state, payload, created_ms, updated_ms) VALUES (%s, %s, 'pending', %s, %s, %s)"
	if s.d == fence.MySQL {
		ins += " ON DUPLICATE KEY UPDATE id = id"
	} else {
		ins += " ON CONFLICT (id) DO NOTHING"
	}
	res, err := s.db.ExecContext(ctx, fmt.Sprintf(ins, s.table, s.ph(1), s.ph(2), s.ph(3), s.now, s.now), id, key, payload)
	if err != nil {
		return Intent{}, false, fmt.Errorf("intent: create %q: %w", id, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return Intent{}, false, fmt.Errorf("intent: create %q: %w", id, err)
	}
	it, err = s.Get(ctx, id)
	if err != nil {
		return Intent{}, false, err
	}
	if n == 0 && it.Payload != payload {
		return it, false, fmt.Errorf("%w: %q", ErrConflict, id)
	}
	return it, n == 1, nil
}

const columns = "id, idempotency_key, state, payload, ref, reason, attempts, fence, updated_ms"

func scan(sc interface{ Scan(...any) error }) (Intent, error) {
	var it Intent
	var f, ms int64
	if err := sc.Scan(&it.ID, &it.IdempotencyKey, &it.State, &it.Payload, &it.Ref, &it.Reason, &it.Attempts, &f, &ms); err != nil {
		return Intent{}, err
	}
	it.Fence = uint64(max(f, 0))
	it.Updated = time.UnixMilli(ms)
	return it, nil
}

// Get returns the intent with id, or an error matching ErrNotFound.
func (s *Store) Get(ctx context.Context, id string) (Intent, error) {
	it, err := scan(s.db.QueryRowContext(ctx, fmt.Sprintf("SELECT %s FROM %s WHERE id = %s", columns, s.table, s.ph(1)), id))
	if errors.Is(err, sql.ErrNoRows) {
		return Intent{}, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	if err != nil {
		return Intent{}, fmt.Errorf("intent: get %q: %w", id, err)
	}
	return it, nil
}

// transition applies a fence-guarded state change and returns the intent
// afterwards. from lists the states it may start from.
func (s *Store) transition(ctx context.Context, op, id string, tok fence.Token, to State, from []State, set string, setArgs ...any) (Intent, fence.Result, error) {
	n := len(setArgs)
	where := make([]string, len(from))
	whereArgs := make([]any, len(from))
	for i, st := range from {
		where[i] = s.ph(n + 2 + i)
		whereArgs[i] = string(st)
	}
	assign := fmt.Sprintf("state = %s, updated_ms = %s", s.ph(n+1), s.now)
	if set != "" {
		assign = set + ", " + assign
	}
	res, err := s.guard.Update(ctx, s.db, id, tok, fence.Write{
		Set:       assign,
		SetArgs:   append(setArgs, string(to)),
		Where:     "state IN (" + strings.Join(where, ", ") + ")",
		WhereArgs: whereArgs,
	})
	if errors.Is(err, fence.ErrNoRow) {
		return Intent{}, res, fmt.Errorf("intent: %s: %w: %q", op, ErrNotFound, id)
	}
	if err != nil {
		return Intent{}, res, fmt.Errorf("intent: %s %q: %w", op, id, err)
	}
	it, err := s.Get(ctx, id)
	if err != nil {
		return Intent{}, res, err
	}
	if res.Outcome == fence.Stale {
		return it, res, fmt.Errorf("intent: %s %q: %w", op, id, res.Err())
	}
	return it, res, nil
}

// Begin records that the holder of tok is about to call the provider: the
// intent moves from pending (or from submitting, when an earlier attempt's
// outcome is unknown) to submitting, with tok's fence. Call the provider
// only when Begin returns nil, and send it.IdempotencyKey.
//
// Errors: ErrResolved (with the intent) when it is already submitted or
// failed; fenced.ErrStaleFence when a newer holder has touched it;
// ErrNotFound; fence.ErrInvalidToken for a bad token.
func (s *Store) Begin(ctx context.Context, id string, tok fence.Token) (Intent, error) {
	it, res, err := s.transition(ctx, "begin", id, tok, Submitting, []State{Pending, Submitting}, "attempts = attempts + 1")
	if err != nil {
		return it, err
	}
	if res.Outcome == fence.PreconditionFailed {
		return it, fmt.Errorf("%w: %q is %s", ErrResolved, id, it.State)
	}
	return it, nil
}

// Complete records the provider's reference: submitting → submitted.
// Errors: fenced.ErrStaleFence when a newer holder has touched the intent
// (its record wins); ErrNotSubmitting when it is not submitting (with the
// intent, which may already be submitted by someone else).
func (s *Store) Complete(ctx context.Context, id string, tok fence.Token, ref string) error {
	return s.finish(ctx, "complete", id, tok, Submitted, "ref = "+s.ph(1), ref)
}

// Fail records that the provider definitively rejected the intent:
// submitting → failed. Errors as for Complete. Do not call it for an
// unknown outcome (a timeout): leave the intent submitting for a retry or
// for the Reconciler.
func (s *Store) Fail(ctx context.Context, id string, tok fence.Token, reason string) error {
	return s.finish(ctx, "fail", id, tok, Failed, "reason = "+s.ph(1), reason)
}

func (s *Store) finish(ctx context.Context, op, id string, tok fence.Token, to State, set string, args ...any) error {
	it, res, err := s.transition(ctx, op, id, tok, to, []State{Submitting}, set, args...)
	if err != nil {
		return err
	}
	if res.Outcome == fence.PreconditionFailed {
		return fmt.Errorf("intent: %s %q: %w (it is %s)", op, id, ErrNotSubmitting, it.State)
	}
	return nil
}

// Reopen moves a submitting intent back to pending, for a reconciliation
// that found the provider never received it: the next attempt sends the
// same idempotency key, so even a late delivery of the lost attempt cannot
// cause a second side effect.
func (s *Store) Reopen(ctx context.Context, id string, tok fence.Token) error {
	return s.finish(ctx, "reopen", id, tok, Pending, "")
}

// Stuck returns intents that have been submitting for at least olderThan,
// by the database's clock, oldest first, at most limit (0: 100).
func (s *Store) Stuck(ctx context.Context, olderThan time.Duration, limit int) ([]Intent, error) {
	if olderThan < 0 {
		return nil, fmt.Errorf("intent: stuck: negative bound %v", olderThan)
	}
	if limit <= 0 {
		limit = 100
	}
	rows, err := s.db.QueryContext(ctx, fmt.Sprintf("SELECT %s FROM %s WHERE state = 'submitting' AND updated_ms <= %s - %s ORDER BY updated_ms LIMIT %d",
		columns, s.table, s.now, s.ph(1), limit), olderThan.Milliseconds())
	if err != nil {
		return nil, fmt.Errorf("intent: stuck: %w", err)
	}
	defer rows.Close()
	var out []Intent
	for rows.Next() {
		it, err := scan(rows)
		if err != nil {
			return nil, fmt.Errorf("intent: stuck: %w", err)
		}
		out = append(out, it)
	}
	return out, rows.Err()
}
