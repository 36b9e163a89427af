// Package fence makes protected resources refuse writes from stale lease
// holders.
//
// A lease decides who may try; the resource decides which writes count. A
// holder paused past its lease (a GC pause, a frozen VM, a partition) wakes
// up believing it still holds the lease. No check on its side can close that
// gap. It can pause between the check and the write. A request can sit in a
// buffer until after a newer holder has been granted the lease. So every
// write carries the lease's token (its key, fence and owner digest), and the
// resource compares it atomically with the write:
//
//   - SQL guards a table's rows (SQLite, PostgreSQL, MySQL/MariaDB through
//     database/sql, or native pgx through package fence/pgxfence):
//     ClaimAndRead raises a row's fence and reads its state first, Update
//     applies a write only when the row's fence is not newer than the
//     writer's.
//   - redisfence.Guard (package fence/redisfence) guards Redis hashes with
//     one Lua script per write.
//   - etcdfence.Guard (package fence/etcdfence) guards etcd keys with one
//     transaction per write.
//     Both live in their own packages, so package fence links neither
//     go-redis nor etcd's client; they build on Prechecks, Refusal and
//     ReportStale, which a guard for another store can use too.
//   - Object guards objects in an object store (ObjectStore; S3-compatible
//     stores through package fence/s3fence): the fence lives in the
//     object's metadata and each write is a conditional PUT on the version
//     read, read again and decided again if another write landed first.
//   - Transport and Middleware carry the token over HTTP (headers
//     Fenced-Key, Fenced-Fence, Fenced-Owner, optionally Fenced-Signature)
//     and check it at the server, with the fences kept by a MemoryStore or,
//     durably, a SQLStore. A command run by `fenced run` finds its token in
//     FENCED_KEY, FENCED_FENCE and FENCED_OWNER (TokenFromEnv).
//
// Every guard compares the same way: a resource that last recorded (fence F,
// owner O) accepts a write carrying (f, o) when f > F, or f == F and o == O.
// The same holder may write many times with one fence. A newer holder locks
// out every older one. An equal fence from a different owner is refused.
// That keeps a fence source that can repeat a number after a failover (Redis
// with asynchronous replicas) from letting two holders write. Refusals say
// why, so the caller never re-reads to find out: Stale, with the newer
// fence, or PreconditionFailed (the fence was fine but the work was already
// done). Stale refusals are reported to fenced.Hooks.StaleWrite: each one is
// a pause that really happened.
//
// Fences are comparable only within one lease key. So every guard binds each
// resource (a SQL row, a Redis hash, an etcd key, an HTTP resource) to one
// key, recorded beside its fence. It refuses a token for another key with
// ErrWrongKey, whatever its fence.
//
// # Tokens are not authenticated
//
// A token is three plain values: anyone who can reach a resource can present
// a fence far above the real ones and lock the key's holders out. Where not
// every writer is trusted, give the guard a Checker. A Verifier accepts only
// tokens signed by a Signer holding an HMAC key shared with the resource
// (Transport.Signer signs on the way out). A Sequencer accepts only the
// fence the lease store currently grants for the key.
//
// # The safe sequence
//
// One pattern, tested end to end against PostgreSQL with a real SIGSTOP
// (README.md and docs/guards.md show the same code):
//
//	// issueInvoice issues invoice id at most once, whatever pauses or crashes.
//	func issueInvoice(ctx context.Context, leases *fenced.Client, guard *fence.SQL, id string, opts *fenced.LeaseOptions) (issued bool, err error) {
//		err = leases.Do(ctx, "invoice:"+id, opts, func(ctx context.Context, lease *fenced.Lease) error {
//			// ctx ends the moment the lease is lost.
//			tok := fence.From(lease)
//			// 1. Claim the row and read the state it inherits: one short
//			//    transaction, committed before any work starts.
//			var status string
//			claim, err := guard.ClaimAndRead(ctx, id, tok, func(ctx context.Context, tx *sql.Tx) error {
//				return tx.QueryRowContext(ctx, `SELECT status FROM invoices WHERE id = $1`, id).Scan(&status)
//			})
//			if err != nil {
//				return err
//			}
//			if !claim.Applied() {
//				return claim.Err() // a newer holder has claimed the row
//			}
//			if status != "due" {
//				return nil // an earlier holder issued it
//			}
//			// 2. The slow work, outside any transaction.
//			pdf, err := render(ctx, id)
//			if err != nil {
//				return err
//			}
//			// 3. The guarded write, a statement of its own: it applies only if
//			//    no newer holder has claimed the row since.
//			res, err := guard.Update(ctx, nil, id, tok, fence.Write{
//				Set: "status = $1, pdf = $2", SetArgs: []any{"issued", pdf},
//				Where: "status = $3", WhereArgs: []any{"due"},
//			})
//			if err != nil {
//				return err
//			}
//			issued = res.Applied()
//			return res.Err() // nil, fenced.ErrStaleFence or fence.ErrPrecondition
//		})
//		return issued, err
//	}
//
// and its setup and outcome handling:
//
//	leases, err := fenced.Open(ctx, dbURL, nil)
//	if err != nil {
//		log.Fatal(err)
//	}
//	defer leases.Close()
//	db, err := sql.Open("pgx", dbURL)
//	if err != nil {
//		log.Fatal(err)
//	}
//	guard, err := fence.NewSQL(db, fence.Postgres, fence.Table{
//		Name: "invoices", Key: "id",
//		LeaseKey: func(id any) string { return fmt.Sprint("invoice:", id) },
//	}, &fence.SQLOptions{Hooks: leases.Hooks()}) // Timeout: 5 s, below a third of the TTL
//	if err != nil {
//		log.Fatal(err)
//	}
//	if err := guard.EnsureColumns(ctx); err != nil { // adds fence, fence_owner, fence_key
//		log.Fatal(err)
//	}
//
//	issued, err := issueInvoice(ctx, leases, guard, "inv_72",
//		&fenced.LeaseOptions{TTL: 30 * time.Second, MaxWait: time.Minute})
//	switch {
//	case issued && err != nil:
//		log.Printf("issued; the lease was lost afterwards: %v", err) // the write counted
//	case issued:
//		log.Print("issued")
//	case err == nil:
//		log.Print("already issued by an earlier holder")
//	case errors.Is(err, fenced.ErrHeld):
//		log.Print("another worker has it")
//	case errors.Is(err, fenced.ErrStaleFence):
//		log.Printf("a newer holder took over; nothing of ours was written: %v", err)
//	case errors.Is(err, fence.ErrPrecondition):
//		log.Print("issued meanwhile by another holder")
//	case fenced.IsLost(err):
//		log.Printf("lease lost before the write; nothing was written, try again later: %v", err)
//	default:
//		log.Print(err)
//	}
//
// Why each step is where it is:
//
//   - Claim first. Fencing cannot cancel a write that arrives before
//     anything newer was recorded: if the old holder's late write lands
//     before the new holder's first write, the resource accepts it. The
//     claim raises the row's fence before the new holder does anything,
//     and reading in the claim's transaction gives it the state every
//     older holder's writes left, with none to come.
//   - Commit before the work, write in a short transaction of its own.
//     Never claim, work and update in one transaction: a holder paused
//     inside it keeps the row locked, the next holder's claim waits behind
//     it, and the paused holder's write lands after its lease ended.
//     SQLOptions.Timeout (default 5 s; keep it below a third of the TTL)
//     bounds the guard's transactions at the database: on PostgreSQL a
//     transaction in which a guarded write applied is ended by the server
//     once it sits idle that long.
//   - The lease's context. Do cancels ctx when the lease is lost, so a
//     holder that notices its loss stops before writing; the fence refuses
//     the one that could not notice (it was paused).
//
// A Stale refusal whose resource fence is far above the token's says so. A
// holder granted its lease just now may be refused. Then the lease store's
// fence counter has probably started again below the fences the resource has
// seen: the lease table changed, the store moved, or lease rows were
// deleted. The store's fence floor must be raised above them.
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
