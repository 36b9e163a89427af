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
//  1. A stable idempotency key, derived once from the intent's namespace and
//     id, stored with the intent and sent on every attempt, so the provider
//     returns the original result for a repeat instead of acting twice.
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
//
// # Identity
//
// An intent is identified by its Store's Namespace and its id. Stores with
// different namespaces may share one table. The same id in two namespaces
// ("42" as a refund and "42" as a payout) is two intents with two
// idempotency keys. Ids and namespaces compare byte for byte: "po_1", "PO_1"
// and "po_1 " are three intents on every database. (On MySQL and MariaDB the
// identity columns are VARBINARY for that reason. A _ci collation folds
// case, and every PAD SPACE collation, _bin ones included, ignores trailing
// spaces.) EnsureTable refuses a table whose key or collations would merge
// distinct intents. The error matches ErrSchema and names each difference;
// nothing is changed then.
//
// # Upgrading a table from before namespaces
//
// Intent tables made by earlier versions of this package have id as their
// only key and no namespace, create_token or checked_ms columns; EnsureTable
// refuses them. Each row's namespace is the part of its idempotency key
// before the final dash and 32 hex digits. With every worker and reconciler
// stopped, rename the old table, let EnsureTable create the new one, copy
// the rows and drop the old table (check that the row counts match before
// the DROP; TestServers runs these steps on all three databases):
//
//	ALTER TABLE fenced_intents RENAME TO fenced_intents_old;
//	-- store.EnsureTable(ctx) creates fenced_intents
//	INSERT INTO fenced_intents (namespace, id, idempotency_key, create_token, state, payload,
//	    ref, reason, attempts, created_ms, updated_ms, checked_ms, fence, fence_owner)
//	  SELECT SUBSTR(idempotency_key, 1, LENGTH(idempotency_key) - 33), id, idempotency_key,
//	    'migrated', state, payload, ref, reason, attempts, created_ms, updated_ms, 0, fence, fence_owner
//	  FROM fenced_intents_old;
//	DROP TABLE fenced_intents_old;
//
// On MySQL write CHAR_LENGTH for LENGTH. The old table held at most one
// intent per id, so nothing can collide in the copy.
//
// # Reconciliation order
//
// Stuck returns the intents examined longest ago first (never examined
// first, then by age). The Reconciler marks every intent it examines,
// whatever the outcome. So intents whose lookup keeps answering Unknown, or
// whose lease stays held, cannot starve the others.
package intent

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fence"
	"github.com/fenced-dev/fenced/internal/backend/sqlident"
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
	// ErrNotFound means no intent has the id in the store's namespace.
	ErrNotFound = errors.New("intent: not found")
	// ErrConflict means Create found an intent with the same id but a
	// different payload.
	ErrConflict = errors.New("intent: id exists with a different payload")
	// ErrSchema means the intent table exists with a shape that cannot
	// keep intents apart (see Identity in the package documentation). It is
	// fence.ErrSchema, so the guard's own schema errors match it too.
	ErrSchema = fence.ErrSchema
)

// Intent is one side effect to be performed at most once.
type Intent struct {
	// Namespace is the namespace of the Store that created the intent.
	Namespace string
	ID        string
	// IdempotencyKey is DeriveKey(Namespace, ID), stored with the intent
	// when it is created; send it on every attempt.
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
	// Checked is when a Reconciler last examined the intent, by the
	// database's clock; zero if never.
	Checked time.Time
}

// DefaultTable is the intent table's default name.
const DefaultTable = "fenced_intents"

// DefaultNamespace is the namespace of a Store whose Options leave it empty.
const DefaultNamespace = "fenced"

// MaxNamespaceLen and MaxIDLen bound a namespace and an intent id, in bytes.
const (
	MaxNamespaceLen = 64
	MaxIDLen        = 255
)

// Options configure a Store. nil gives the defaults.
type Options struct {
	// Table is the intent table; default DefaultTable. Several stores with
	// different namespaces may share it.
	Table string
	// Namespace is part of every intent's identity and prefixes its derived
	// idempotency key, so that intents of different kinds may share ids
	// and a table; default DefaultNamespace. At most MaxNamespaceLen bytes
	// of printable ASCII without spaces (it is sent in Idempotency-Key
	// headers).
	Namespace string
	// Hook receives an EventStaleWrite for each transition refused as
	// stale. Leave it nil to report to the hook of the client that issued each
	// lease (fence.From carries them); set it to report elsewhere.
	Hook func(fenced.Event)
}

// Store keeps intents in a SQL table. It is safe for concurrent use.
type Store struct {
	db        *sql.DB
	d         fence.Dialect
	table     string
	namespace string
	// guard keys rows by idempotency_key, which is unique and derived from
	// (namespace, id): one column that identifies an intent across
	// namespaces, as the guard needs.
	guard *fence.SQL
	now   string // SQL expression: milliseconds since the epoch, database clock
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
		o.Namespace = DefaultNamespace
	}
	if err := sqlident.Check("intent table", o.Table); err != nil {
		return nil, fmt.Errorf("intent: %w", err)
	}
	if err := checkNamespace(o.Namespace); err != nil {
		return nil, err
	}
	g, err := fence.NewSQL(db, d, fence.Table{Name: o.Table, Key: "idempotency_key"}, &fence.SQLOptions{Hook: o.Hook})
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

func checkNamespace(ns string) error {
	if len(ns) > MaxNamespaceLen {
		return fmt.Errorf("intent: namespace %q is %d bytes, longer than %d", ns, len(ns), MaxNamespaceLen)
	}
	for i := 0; i < len(ns); i++ {
		if c := ns[i]; c <= ' ' || c > '~' {
			return fmt.Errorf("intent: namespace %q has a space, control or non-ASCII byte at %d (it is sent in Idempotency-Key headers)",
				ns, i)
		}
	}
	return nil
}

// Namespace returns the store's namespace.
func (s *Store) Namespace() string { return s.namespace }

// Table returns the intent table's name.
func (s *Store) Table() string { return s.table }

// Guard returns the fence guard over the intent table. Its rows are keyed by
// idempotency key, not by id: pass DeriveKey(s.Namespace(), id) (or
// Intent.IdempotencyKey) as the row key, or use Claim.
func (s *Store) Guard() *fence.SQL { return s.guard }

// Claim records tok's fence on intent id without changing its state, for a
// holder that wants to fence out older holders before it decides anything
// (see fence.SQL.Claim). q may be the caller's transaction; nil means the
// store's database. A missing intent is an error matching ErrNotFound.
func (s *Store) Claim(ctx context.Context, q fence.Querier, id string, tok fence.Token) (fence.Result, error) {
	res, err := s.guard.Claim(ctx, q, DeriveKey(s.namespace, id), tok)
	if errors.Is(err, fence.ErrNoRow) {
		return res, fmt.Errorf("intent: claim: %w: %q in namespace %q", ErrNotFound, id, s.namespace)
	}
	if err != nil {
		return res, fmt.Errorf("intent: claim %q: %w", id, err)
	}
	return res, nil
}

func (s *Store) ph(n int) string {
	if s.d == fence.Postgres {
		return fmt.Sprintf("$%d", n)
	}
	return "?"
}

// createTableSQL is the intent table. On MySQL the identity columns are
// VARBINARY (compared byte for byte, trailing spaces included) and the text
// columns utf8mb4 with a binary collation, whatever the server's defaults.
func (s *Store) createTableSQL() string {
	ident, text, long, suffix := "TEXT", "TEXT", "TEXT", ""
	owner := "TEXT"
	if s.d == fence.MySQL {
		ident, text, long = "VARBINARY(255)", "VARCHAR(1024)", "MEDIUMTEXT"
		owner = fmt.Sprintf("VARBINARY(%d)", fence.MaxOwnerLen)
		suffix = " ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"
	}
	return fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
  namespace %s NOT NULL,
  id %s NOT NULL,
  idempotency_key %s NOT NULL UNIQUE,
  create_token %s NOT NULL,
  state VARCHAR(16) NOT NULL CHECK (state IN ('pending', 'submitting', 'submitted', 'failed')),
  payload %s NOT NULL,
  ref %s NOT NULL DEFAULT '',
  reason %s NOT NULL DEFAULT '',
  attempts INTEGER NOT NULL DEFAULT 0,
  created_ms BIGINT NOT NULL,
  updated_ms BIGINT NOT NULL,
  checked_ms BIGINT NOT NULL DEFAULT 0,
  fence BIGINT NOT NULL DEFAULT 0 CHECK (fence >= 0),
  fence_owner %s NOT NULL DEFAULT '',
  PRIMARY KEY (namespace, id)
)%s`, s.table, ident, ident, ident, ident, long, text, text, owner, suffix)
}

// EnsureTable creates the intent table if it does not exist and checks the
// shape of an existing one. The key must be (namespace, id), idempotency_key
// unique, and the identity columns compared byte for byte. A table of
// another shape (from an older version: see the package documentation) is an
// error matching ErrSchema naming every difference, and nothing is changed.
// Running it concurrently from several processes is safe.
func (s *Store) EnsureTable(ctx context.Context) error {
	if _, err := s.db.ExecContext(ctx, s.createTableSQL()); err != nil {
		// A concurrent creator may have won the race (PostgreSQL reports a
		// duplicate catalog row for IF NOT EXISTS racing itself).
		if exists, _ := s.tableExists(ctx); !exists {
			return fmt.Errorf("intent: create table %s: %w", s.table, err)
		}
	}
	if err := s.checkShape(ctx); err != nil {
		return err
	}
	// The guard may want columns of its own that this table lacks.
	if err := s.guard.EnsureColumns(ctx); err != nil {
		return fmt.Errorf("intent: %w", err)
	}
	if err := s.guard.Check(ctx); err != nil {
		return fmt.Errorf("intent: %w", err)
	}
	return nil
}

// DeriveKey returns the idempotency key of intent id in namespace: the
// namespace, a dash and 32 hex digits of SHA-256 over both. It is
// deterministic, so a retried Create derives the same key, and short enough
// for every provider limit we know of.
func DeriveKey(namespace, id string) string {
	sum := sha256.Sum256([]byte(namespace + "\x00" + id))
	return namespace + "-" + hex.EncodeToString(sum[:16])
}

func newCreateToken() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("intent: crypto/rand failed: " + err.Error())
	}
	return hex.EncodeToString(b[:])
}

// Create records a pending intent with its idempotency key, or returns the
// existing intent when id was created before in the store's namespace with
// the same payload (created = false). An id created with a different
// payload is an error matching ErrConflict; nothing is changed.
//
// Whether this call created the row is decided by a random creation token
// written with it and read back. It never uses affected-row counts, which
// drivers report differently (MySQL's clientFoundRows counts a duplicate
// as found). A row that reads back with another id or payload than was
// written (a column that truncates or converts) is an error.
func (s *Store) Create(ctx context.Context, id, payload string) (it Intent, created bool, err error) {
	if id == "" || len(id) > MaxIDLen {
		return Intent{}, false, fmt.Errorf("intent: create: id must be 1..%d bytes, got %d", MaxIDLen, len(id))
	}
	key := DeriveKey(s.namespace, id)
	token := newCreateToken()
	ins := "INSERT INTO %s (namespace, id, idempotency_key, create_token, state, payload, created_ms, updated_ms) " +
		"VALUES (%s, %s, %s, %s, 'pending', %s, %s, %s)"
	if s.d == fence.MySQL {
		ins += " ON DUPLICATE KEY UPDATE id = id"
	} else {
		ins += " ON CONFLICT (namespace, id) DO NOTHING"
	}
	q := fmt.Sprintf(ins, s.table, s.ph(1), s.ph(2), s.ph(3), s.ph(4), s.ph(5), s.now, s.now)
	if _, err := s.db.ExecContext(ctx, q, s.namespace, id, key, token, payload); err != nil {
		return Intent{}, false, fmt.Errorf("intent: create %q: %w", id, err)
	}
	it, stored, err := s.get(ctx, id)
	if errors.Is(err, ErrNotFound) {
		// MySQL's upsert also stops at a duplicate idempotency_key.
		return Intent{}, false, fmt.Errorf("intent: create %q: no row after insert: idempotency key %s belongs to another row", id, key)
	}
	if err != nil {
		return Intent{}, false, err
	}
	created = stored == token
	switch {
	case it.Payload == payload && it.ID == id:
		return it, created, nil
	case it.ID != id:
		return it, false, fmt.Errorf("intent: create %q: the table matched stored id %q: its id column is not byte-exact (see EnsureTable)",
			id, it.ID)
	case created:
		return it, true, fmt.Errorf(
			"intent: create %q: stored payload or id differs (%d bytes stored, %d written): check column types and character set",
			id, len(it.Payload), len(payload))
	}
	return it, false, fmt.Errorf("%w: %q in namespace %q", ErrConflict, id, s.namespace)
}

const columns = "namespace, id, idempotency_key, state, payload, ref, reason, attempts, fence, updated_ms, checked_ms"

func scan(sc interface{ Scan(...any) error }, extra ...any) (Intent, error) {
	var it Intent
	var f, ms, checked int64
	dest := append([]any{&it.Namespace, &it.ID, &it.IdempotencyKey, &it.State, &it.Payload, &it.Ref, &it.Reason, &it.Attempts, &f,
		&ms, &checked}, extra...)
	if err := sc.Scan(dest...); err != nil {
		return Intent{}, err
	}
	it.Fence = uint64(max(f, 0))
	it.Updated = time.UnixMilli(ms)
	if checked > 0 {
		it.Checked = time.UnixMilli(checked)
	}
	return it, nil
}

// Get returns the intent with id in the store's namespace, or an error
// matching ErrNotFound.
func (s *Store) Get(ctx context.Context, id string) (Intent, error) {
	it, _, err := s.get(ctx, id)
	return it, err
}

// get returns the intent and its creation token.
func (s *Store) get(ctx context.Context, id string) (Intent, string, error) {
	var token string
	it, err := scan(s.db.QueryRowContext(ctx, fmt.Sprintf("SELECT %s, create_token FROM %s WHERE namespace = %s AND id = %s",
		columns, s.table, s.ph(1), s.ph(2)), s.namespace, id), &token)
	if errors.Is(err, sql.ErrNoRows) {
		return Intent{}, "", fmt.Errorf("%w: %q in namespace %q", ErrNotFound, id, s.namespace)
	}
	if err != nil {
		return Intent{}, "", fmt.Errorf("intent: get %q: %w", id, err)
	}
	return it, token, nil
}

// transition applies a fence-guarded state change and returns the intent
// afterwards. from lists the states it may start from.
func (s *Store) transition(ctx context.Context, op, id string, tok fence.Token, to State, from []State, set string,
	setArgs ...any) (Intent, fence.Result, error) {
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
	res, err := s.guard.Update(ctx, s.db, DeriveKey(s.namespace, id), tok, fence.Write{
		Set:       assign,
		SetArgs:   append(setArgs, string(to)),
		Where:     "state IN (" + strings.Join(where, ", ") + ")",
		WhereArgs: whereArgs,
	})
	if errors.Is(err, fence.ErrNoRow) {
		return Intent{}, res, fmt.Errorf("intent: %s: %w: %q in namespace %q", op, ErrNotFound, id, s.namespace)
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

// Begin records that the holder of tok is about to call the provider. The
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

// Complete records the provider's reference: submitting → submitted. ref
// must not be empty. A reply without a reference is not proof of success
// (a replayed rejection, a proxy's empty 200), so leave the intent
// submitting for the Reconciler instead.
//
// Errors: fenced.ErrStaleFence when a newer holder has touched the intent
// (its record wins); ErrNotSubmitting when it is not submitting (with the
// intent, which may already be submitted by someone else).
func (s *Store) Complete(ctx context.Context, id string, tok fence.Token, ref string) error {
	if ref == "" {
		return fmt.Errorf("intent: complete %q: empty provider reference (nothing recorded; the intent stays as it was)", id)
	}
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
// that found the provider never received it. The next attempt sends the same
// idempotency key. So even a late delivery of the lost attempt cannot cause
// a second side effect.
func (s *Store) Reopen(ctx context.Context, id string, tok fence.Token) error {
	return s.finish(ctx, "reopen", id, tok, Pending, "")
}

// Stuck returns intents of the store's namespace that have been submitting
// for at least olderThan, by the database's clock, at most limit (0: 100).
// First those never examined by a Reconciler first. Then those examined
// longest ago, each group oldest first.
func (s *Store) Stuck(ctx context.Context, olderThan time.Duration, limit int) ([]Intent, error) {
	if olderThan < 0 {
		return nil, fmt.Errorf("intent: stuck: negative bound %v", olderThan)
	}
	if limit <= 0 {
		limit = 100
	}
	rows, err := s.db.QueryContext(ctx, fmt.Sprintf(`SELECT %s FROM %s
WHERE namespace = %s AND state = 'submitting' AND updated_ms <= %s - %s
ORDER BY checked_ms, updated_ms, id LIMIT %d`,
		columns, s.table, s.ph(1), s.now, s.ph(2), limit), s.namespace, olderThan.Milliseconds())
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

// markChecked records that a Reconciler is examining intent id now, so that
// Stuck puts it behind the intents examined less recently. It changes only
// the bookkeeping column checked_ms, never state or fence, so it needs no
// lease.
func (s *Store) markChecked(ctx context.Context, id string) error {
	_, err := s.db.ExecContext(ctx, fmt.Sprintf("UPDATE %s SET checked_ms = %s WHERE namespace = %s AND id = %s",
		s.table, s.now, s.ph(1), s.ph(2)), s.namespace, id)
	if err != nil {
		return fmt.Errorf("intent: mark %q checked: %w", id, err)
	}
	return nil
}
