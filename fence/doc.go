// Package fence makes protected resources refuse writes from stale lease
// holders.
//
// A lease decides who may try; the resource decides which writes count. A
// holder paused past its lease (a GC pause, a frozen VM, a partition) wakes
// up believing it still holds the lease, and no check on its side can close
// that gap: it can pause between the check and the write, and a request can
// sit in a buffer until after a newer holder has been granted the lease. So
// every write carries the lease's fence, and the resource compares it
// atomically with the write:
//
//   - SQL guards a table's rows (SQLite, PostgreSQL, MySQL/MariaDB through
//     database/sql, or native pgx through package fence/pgxfence): Claim
//     raises a row's fence first, Update applies a write only when the row's
//     fence is not newer than the writer's.
//   - redisfence.Guard (package fence/redisfence) guards Redis hashes with
//     one Lua script per write.
//   - etcdfence.Guard (package fence/etcdfence) guards etcd keys with one
//     transaction per write.
//     Both live in their own packages, so package fence links neither
//     go-redis nor etcd's client; they build on Prechecks, Refusal and
//     ReportStale, which a guard for another store can use too.
//   - Transport and Middleware carry the token over HTTP (headers
//     Fenced-Key, Fenced-Fence, Fenced-Owner, optionally Fenced-Signature)
//     and check it at the server, with the fences kept by a MemoryStore or,
//     durably, a SQLStore. A command run by `fenced run` finds its token in
//     FENCED_KEY, FENCED_FENCE and FENCED_OWNER (TokenFromEnv).
//
// Every guard compares the same way: a resource that last recorded
// (fence F, owner O) accepts a write carrying (f, o) when f > F, or f == F
// and o == O. The same holder may write many times with one fence; a newer
// holder locks out every older one; and an equal fence from a different
// owner is refused, which keeps a fence source that can repeat a number
// after a failover (Redis with asynchronous replicas) from letting two
// holders write. Refusals say why (Stale, with the newer fence, or
// PreconditionFailed: the fence was fine but the work was already done), so
// the caller never re-reads to find out, and stale refusals are reported to
// fenced.Hooks.StaleWrite: each one is a pause that really happened.
//
// Fences are comparable only within one lease key, so the Redis, etcd and
// HTTP guards bind each resource to one key and refuse a token for another
// key with ErrWrongKey, whatever its fence.
//
// # Tokens are not authenticated
//
// A token is three plain values: anyone who can reach a resource can
// present a fence far above the real ones and lock the key's holders out.
// Where not every writer is trusted, give the guard a Checker: a Verifier
// accepts only tokens signed by a Signer holding an HMAC key shared with the
// resource (Transport.Signer signs on the way out), and a Sequencer accepts
// only the fence the lease store currently grants for the key.
//
// # Claim first
//
// Fencing cannot cancel a write that arrives before anything newer was
// recorded: if the old holder's late write lands before the new holder's
// first write, the resource has nothing newer to compare with and accepts
// it. A new holder closes that window by claiming the row (raising its
// fence) as its first action, in the same transaction as the read of the
// state it inherits:
//
//	tx, _ := db.BeginTx(ctx, nil)
//	r, err := guard.Claim(ctx, tx, jobID, fence.From(lease))
//	// r.Outcome == fence.Stale: a newer holder exists; give up.
//	// otherwise read the row in tx, decide, and write with guard.Update.
//
// # Side effects a fence cannot reach
//
// A payment provider or a mail server does not check fences. Package intent
// records durable intent before the call, sends a stable idempotency key on
// every attempt and reconciles attempts whose outcome is unknown.
//
// # Which one do I need
//
// See docs/guards.md (linked from the README) for the lock-free
// alternatives (a unique-constraint claim, a single-statement conditional
// update, optimistic versioning) and when a lease plus a fence is needed at
// all.
package fence
